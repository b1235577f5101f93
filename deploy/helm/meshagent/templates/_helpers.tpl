{{/* Names, labels and the settings every meshagent container shares. */}}

{{- define "meshagent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "meshagent.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component ("workload", "node" or "node-socket"); never change on upgrade. */}}
{{- define "meshagent.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "meshagent.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "meshagent.sidecarName" -}}
{{- .Values.sidecar.name | default (printf "%s-workload" (include "meshagent.fullname" .)) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meshagent.sidecarServiceAccount" -}}
{{- .Values.sidecar.serviceAccount.name | default (include "meshagent.sidecarName" .) -}}
{{- end -}}

{{/* <fullname>-node, or the fullname alone when it already ends in -node (release meshagent-node). */}}
{{- define "meshagent.nodeName" -}}
{{- $full := include "meshagent.fullname" . -}}
{{- if hasSuffix "-node" $full -}}
{{- $full -}}
{{- else -}}
{{- printf "%s-node" $full | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The node socket DaemonSet (socket holder, CSI driver) and its service account. */}}
{{- define "meshagent.nodeSocketName" -}}
{{- printf "%s-socket" (include "meshagent.nodeName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meshagent.nodeServiceAccount" -}}
{{- .Values.node.serviceAccount.name | default (include "meshagent.nodeName" .) -}}
{{- end -}}

{{- define "meshagent.validate" -}}
{{- if not (has .Values.caProvider (list "Citadel" "Linkerd")) -}}
{{- fail (printf "caProvider must be Citadel or Linkerd, not %q" .Values.caProvider) -}}
{{- end -}}
{{- if not (has .Values.credentialFetcherType (list "JWT" "TokenRequest")) -}}
{{- fail (printf "credentialFetcherType must be JWT or TokenRequest, not %q" .Values.credentialFetcherType) -}}
{{- end -}}
{{- if .Values.sidecar.enabled -}}
{{- $drain := toString .Values.sidecar.terminationDrainDuration -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]{1,9})?s$" $drain) -}}
{{- fail (printf "sidecar.terminationDrainDuration must be seconds such as \"5s\" or \"0.5s\", not %q" $drain) -}}
{{- end -}}
{{- if le (float64 .Values.sidecar.terminationGracePeriodSeconds) (float64 (trimSuffix "s" $drain)) -}}
{{- fail (printf "sidecar.terminationGracePeriodSeconds (%v) must be longer than sidecar.terminationDrainDuration (%s): the kubelet kills the agent at the end of the grace period" .Values.sidecar.terminationGracePeriodSeconds $drain) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* true when the agent asks the API server for its own token. */}}
{{- define "meshagent.tokenRequest" -}}
{{- if eq .Values.credentialFetcherType "TokenRequest" }}true{{ end -}}
{{- end -}}

{{- define "meshagent.audience" -}}
{{- if .Values.token.audience -}}
{{- .Values.token.audience -}}
{{- else if eq .Values.caProvider "Linkerd" -}}
identity.l5d.io
{{- else -}}
istio-ca
{{- end -}}
{{- end -}}

{{/*
Environment shared by the sidecar and node agents: who the pod is (downward API), which
CA, how it authenticates; the sidecar passes its drain as .terminationDrainDuration
(merged into the context), which goes into PROXY_CONFIG. The agent runs with working directory /, so the relative
default paths of its settings land on the mounted volumes.
*/}}
{{- define "meshagent.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: SERVICE_ACCOUNT
  valueFrom:
    fieldRef:
      fieldPath: spec.serviceAccountName
- name: INSTANCE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: CA_PROVIDER
  value: {{ .Values.caProvider | quote }}
{{- with .Values.caAddress }}
- name: CA_ADDR
  value: {{ . | quote }}
{{- end }}
{{- with .Values.istiodSAN }}
- name: ISTIOD_SAN
  value: {{ . | quote }}
{{- end }}
- name: TRUST_DOMAIN
  value: {{ .Values.trustDomain | quote }}
{{- with .Values.clusterID }}
- name: ISTIO_META_CLUSTER_ID
  value: {{ . | quote }}
{{- end }}
- name: CREDENTIAL_FETCHER_TYPE
  value: {{ .Values.credentialFetcherType | quote }}
{{- with .Values.token.audience }}
- name: CREDENTIAL_IDENTITY_PROVIDER
  value: {{ . | quote }}
{{- end }}
{{- if and (include "meshagent.tokenRequest" .) .Values.token.lifetime }}
- name: MESHAGENT_TOKEN_LIFETIME
  value: {{ .Values.token.lifetime | quote }}
{{- end }}
{{- $proxyConfig := dict "discoveryAddress" .Values.discoveryAddress "statusPort" (int .Values.statusPort) }}
{{- with .terminationDrainDuration }}
{{- $_ := set $proxyConfig "terminationDrainDuration" . }}
{{- end }}
- name: PROXY_CONFIG
  value: {{ $proxyConfig | toJson | quote }}
- name: MESHAGENT_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- range .Values.extraEnv }}
{{- if hasKey . "value" }}
- name: {{ .name | quote }}
  value: {{ .value | toString | quote }}
{{- else }}
- {{ toYaml . | nindent 2 | trim }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Probes on the status port (docs/operations.md): ready once a certificate is held, live until it expires. */}}
{{- define "meshagent.probes" -}}
readinessProbe:
  httpGet:
    path: /healthz/ready
    port: status
  periodSeconds: 2
  failureThreshold: 3
livenessProbe:
  httpGet:
    path: /healthz/live
    port: status
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 3
{{- end -}}

{{/* The token and CA root volumes both agents mount. */}}
{{- define "meshagent.credentialVolumes" -}}
{{- if not (include "meshagent.tokenRequest" .) }}
- name: istio-token
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ include "meshagent.audience" . | quote }}
          expirationSeconds: {{ int .Values.token.expirationSeconds }}
          path: istio-token
{{- end }}
- name: ca-root
  configMap:
    name: {{ .Values.caRoot.configMap | quote }}
    items:
      - key: {{ .Values.caRoot.key | quote }}
        path: root-cert.pem
{{- end -}}

{{- define "meshagent.credentialMounts" -}}
{{- if not (include "meshagent.tokenRequest" .) }}
- name: istio-token
  mountPath: /var/run/secrets/tokens
  readOnly: true
{{- end }}
- name: ca-root
  mountPath: /var/run/secrets/istio
  readOnly: true
{{- end -}}
