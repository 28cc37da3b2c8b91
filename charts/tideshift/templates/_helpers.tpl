{{/* The four control-loop services, in pipeline order. */}}
{{- define "tideshift.services" -}}
watcher predictor planner executor
{{- end -}}

{{- define "tideshift.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object name prefix; kept to 45 characters so "-<service>-metrics" still fits in 63. */}}
{{- define "tideshift.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tideshift.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tideshift.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tideshift.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tideshift.labels" -}}
helm.sh/chart: {{ include "tideshift.chart" . }}
{{ include "tideshift.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tideshift
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component: (dict "root" $ "component" "planner"). */}}
{{- define "tideshift.componentLabels" -}}
{{ include "tideshift.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tideshift.componentSelectorLabels" -}}
{{ include "tideshift.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tideshift.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* A service's image: (dict "root" $ "service" "predictor"); its own `image` fields where
set, else the chart-wide `image`'s. */}}
{{- define "tideshift.serviceImage" -}}
{{- $root := .root -}}
{{- $own := (index $root.Values .service).image | default dict -}}
{{- $tag := default (default $root.Chart.AppVersion $root.Values.image.tag) $own.tag -}}
{{- printf "%s:%s" (default $root.Values.image.repository $own.repository) $tag -}}
{{- end -}}

{{- define "tideshift.natsSecretName" -}}
{{- default (printf "%s-nats" (include "tideshift.fullname" .)) .Values.nats.existingSecret -}}
{{- end -}}

{{- define "tideshift.natsServiceName" -}}
{{- printf "%s-nats" (include "tideshift.fullname" .) -}}
{{- end -}}

{{/* The NATS URL the chart-created Secret carries. */}}
{{- define "tideshift.natsUrl" -}}
{{- if .Values.nats.bundled.enabled -}}
{{- printf "nats://%s.%s.svc:%d" (include "tideshift.natsServiceName" .) .Release.Namespace (int .Values.nats.bundled.port) -}}
{{- else -}}
{{- required "nats.url (or nats.existingSecret) is required when nats.bundled.enabled is false" .Values.nats.url -}}
{{- end -}}
{{- end -}}

{{/* Every NATS user of files/nats-authorization.conf (generated from permissions.ROLES). */}}
{{- define "tideshift.natsRoles" -}}
watcher predictor planner executor operator coordinator pserver trainer reaction
{{- end -}}

{{/* Logins are on for the bundled NATS, or for an external one given `nats.auth.existingSecret`
(an external NATS with a .creds file keeps that instead). */}}
{{- define "tideshift.natsAuth" -}}
{{- if and .Values.nats.auth.enabled (or .Values.nats.bundled.enabled .Values.nats.auth.existingSecret) -}}true{{- end -}}
{{- end -}}

{{- define "tideshift.natsUsersSecretName" -}}
{{- default (printf "%s-nats-users" (include "tideshift.fullname" .)) .Values.nats.auth.existingSecret -}}
{{- end -}}

{{/* The NATS login of one role (dict "root" . "role" name): its user and its password. */}}
{{- define "tideshift.natsLogin" -}}
{{- if include "tideshift.natsAuth" .root }}
- name: TIDESHIFT_NATS_USER
  value: {{ .role | quote }}
- name: TIDESHIFT_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "tideshift.natsUsersSecretName" .root }}
      key: {{ .role }}
{{- end }}
{{- end -}}

{{- define "tideshift.hasCredentials" -}}
{{- if or .Values.nats.existingSecret .Values.nats.credentials -}}true{{- end -}}
{{- end -}}

{{/*
One setting as an environment variable value: strings as they are, everything else as JSON
(Helm holds numbers as floats; JSON prints 1048576, not 1.048576e+06). Unset (null) settings
are left out so the service's own default applies.
*/}}
{{- define "tideshift.settingsEnv" -}}
{{- range $key, $value := . }}
{{- if not (kindIs "invalid" $value) }}
- name: TIDESHIFT_{{ upper $key }}
  value: {{ ternary $value (toJson $value) (kindIs "string" $value) | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Environment shared by every Tideshift container: NATS from the Secret, identity, HOME. */}}
{{- define "tideshift.natsEnv" -}}
- name: TIDESHIFT_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tideshift.natsSecretName" . }}
      key: {{ .Values.nats.secretKeys.url }}
{{- if include "tideshift.hasCredentials" . }}
- name: TIDESHIFT_NATS_CREDENTIALS
  value: /var/run/secrets/tideshift/nats/{{ .Values.nats.secretKeys.credentials }}
{{- end }}
- name: TIDESHIFT_INSTANCE
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{ include "tideshift.natsReplicasEnv" . }}
# The root filesystem is read-only: caches and temporary files go to the /tmp emptyDir.
- name: HOME
  value: /tmp
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
{{- end -}}

{{- define "tideshift.natsVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if include "tideshift.hasCredentials" . }}
- name: nats-credentials
  mountPath: /var/run/secrets/tideshift/nats
  readOnly: true
{{- end }}
{{- end -}}

{{- define "tideshift.natsVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- if include "tideshift.hasCredentials" . }}
- name: nats-credentials
  secret:
    secretName: {{ include "tideshift.natsSecretName" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.nats.secretKeys.credentials }}
        path: {{ .Values.nats.secretKeys.credentials }}
{{- end }}
{{- end -}}

{{/*
ClusterRole rules of a service from files/rbac.yaml (owned with the watcher and executor:
one ClusterRole document per service, matched by the name suffix -<service>), so the chart
and those services' tests share one definition. Returns {"rules": [...]} as YAML.
*/}}
{{- define "tideshift.fileRules" -}}
{{- $service := .service -}}
{{- $rules := list -}}
{{- $found := false -}}
{{- range $document := regexSplit "(?m)^---\\s*$" (.root.Files.Get "files/rbac.yaml") -1 }}
{{- $role := fromYaml $document -}}
{{- if and $role (eq (get $role "kind") "ClusterRole") -}}
{{- $name := get (get $role "metadata" | default dict) "name" | default "" -}}
{{- if hasSuffix (printf "-%s" $service) $name -}}
{{- $rules = get $role "rules" | default list -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}
{{- fail (printf "charts/tideshift/files/rbac.yaml has no ClusterRole named *-%s: the %s needs its Kubernetes rules there" $service $service) -}}
{{- end -}}
{{- toYaml (dict "rules" $rules) -}}
{{- end -}}
