{{/*
Every NATS user of files/nats-authorization.conf: the services' roles (`tideshift.natsRoles`)
and the `provisioner`, which only the provisioning Job (nats-provision.yaml) logs in as.
*/}}
{{- define "tideshift.natsUsers" -}}
{{ include "tideshift.natsRoles" . }} provisioner
{{- end -}}

{{/*
TLS to NATS (nats.tls): the CA a Tideshift pod trusts and, for mutual TLS, the certificate it
presents, handed to the bus as TIDESHIFT_NATS_TLS_* (services/common/bus/connect.py).
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
