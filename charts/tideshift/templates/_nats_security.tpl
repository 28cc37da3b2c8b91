{{/*
Every NATS user of files/nats-authorization.conf: the services' roles (`tideshift.natsRoles`)
and the `provisioner`, which only the provisioning Job (nats-provision.yaml) logs in as.
*/}}
{{- define "tideshift.natsUsers" -}}
{{ include "tideshift.natsRoles" . }} provisioner
{{- end -}}

{{/*
TLS to NATS (nats.tls): the CA a Tideshift pod trusts and, for mutual TLS, the certificate it
presents, handed to every client as TIDESHIFT_NATS_TLS_* (events/tls.py): the services, the
provisioning Job, the reaction Deployment and the `helm test` Pod.
*/}}
{{- define "tideshift.natsTlsCaSecret" -}}
{{- .Values.nats.tls.caSecret | default .Values.nats.bundled.tls.secretName -}}
{{- end -}}

{{- define "tideshift.natsTlsEnv" -}}
{{- if .Values.nats.tls.enabled }}
- name: TIDESHIFT_NATS_TLS_CA_FILE
  value: /var/run/secrets/tideshift/nats-ca/ca.crt
{{- if .Values.nats.tls.clientSecret }}
- name: TIDESHIFT_NATS_TLS_CERT_FILE
  value: /var/run/secrets/tideshift/nats-client/tls.crt
- name: TIDESHIFT_NATS_TLS_KEY_FILE
  value: /var/run/secrets/tideshift/nats-client/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{- define "tideshift.natsTlsVolumeMounts" -}}
{{- if .Values.nats.tls.enabled }}
- name: nats-ca
  mountPath: /var/run/secrets/tideshift/nats-ca
  readOnly: true
{{- if .Values.nats.tls.clientSecret }}
- name: nats-client
  mountPath: /var/run/secrets/tideshift/nats-client
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{- define "tideshift.natsTlsVolumes" -}}
{{- if .Values.nats.tls.enabled }}
- name: nats-ca
  secret:
    secretName: {{ required "nats.tls.caSecret (or nats.bundled.tls.secretName) is required when nats.tls.enabled" (include "tideshift.natsTlsCaSecret" .) }}
    defaultMode: 0444
    items:
      - key: ca.crt
        path: ca.crt
{{- if .Values.nats.tls.clientSecret }}
- name: nats-client
  secret:
    secretName: {{ .Values.nats.tls.clientSecret }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/*
A service's init container (dict "root" "service"): with logins on, only the provisioning Job
creates the streams and buckets, so the service waits for them, with its own login, saying
what is missing (`tideshift nats provision --wait`) rather than failing on a missing bucket.
*/}}
{{- define "tideshift.natsProvisionedWait" -}}
{{- $root := .root }}
{{- if and (include "tideshift.natsAuth" $root) $root.Values.nats.provision.enabled }}
initContainers:
  - name: wait-for-streams
    image: {{ include "tideshift.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    args: ["nats", "provision", "--wait"]
    env:
      {{- include "tideshift.natsEnv" $root | nindent 6 }}
      {{- include "tideshift.natsLogin" (dict "root" $root "role" .service) | nindent 6 }}
      {{- include "tideshift.natsTlsEnv" $root | nindent 6 }}
    resources:
      requests:
        cpu: 20m
        memory: 64Mi
      limits:
        memory: 192Mi
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    volumeMounts:
      {{- include "tideshift.natsVolumeMounts" $root | nindent 6 }}
      {{- include "tideshift.natsTlsVolumeMounts" $root | nindent 6 }}
{{- end }}
{{- end -}}

{{/*
How many NATS servers keep each stream and bucket (TIDESHIFT_NATS_REPLICAS): the bundled
cluster's size, or `nats.replicas` for an external NATS (3 for the NATS chart's cluster).
Read by the provisioning Job, and by the executor for its history stream.
*/}}
{{- define "tideshift.natsReplicas" -}}
{{- if .Values.nats.bundled.enabled -}}
{{- int .Values.nats.bundled.replicas -}}
{{- else -}}
{{- int .Values.nats.replicas -}}
{{- end -}}
{{- end -}}

{{- define "tideshift.natsReplicasEnv" -}}
- name: TIDESHIFT_NATS_REPLICAS
  value: {{ include "tideshift.natsReplicas" . | quote }}
{{- end -}}
