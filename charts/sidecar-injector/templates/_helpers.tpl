{{/* Names and labels. */}}
{{- define "sidecar-injector.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The full name; a revision's installation ends in "-<revision>" (objects of two revisions never clash). */}}
{{- define "sidecar-injector.fullname" -}}
{{- $base := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $base = .Values.fullnameOverride -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- $base = .Release.Name -}}
{{- else -}}
{{- $base = printf "%s-%s" .Release.Name $name -}}
{{- end -}}
{{- end -}}
{{- if and .Values.revision (not (hasSuffix (printf "-%s" .Values.revision) $base)) -}}
{{- printf "%s-%s" ($base | trunc (int (sub 62 (len .Values.revision))) | trimSuffix "-") .Values.revision -}}
{{- else -}}
{{- $base | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sidecar-injector.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sidecar-injector.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sidecar-injector.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sidecar-injector.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.revision }}
{{ $.Values.config.revisionLabel }}: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "sidecar-injector.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sidecar-injector.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sidecar-injector.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Whether the in-cluster server (Deployment, Service, ...) is rendered: "true" or "". */}}
{{- define "sidecar-injector.inCluster" -}}
{{- if and (include "sidecar-injector.webhookMode" .) .Values.deployment.enabled (gt (int .Values.replicaCount) 0) -}}true{{- end -}}
{{- end -}}

{{/* Whether the webhooks are installed (mode=webhook): "true" or "". In policy mode the API
server injects by itself (a MutatingAdmissionPolicy) and nothing of the server is rendered. */}}
{{- define "sidecar-injector.webhookMode" -}}
{{- if eq .Values.mode "webhook" -}}true{{- end -}}
{{- end -}}

{{/* What the exported policies depend on: the configuration, every template, and the webhook
selectors they copy. The shipped export (files/policies/) carries the fingerprint of the
chart's defaults; another configuration needs its own export. */}}
{{- define "sidecar-injector.policyFingerprint" -}}
{{- $inputs := dict
  "config" .Values.config
  "revision" .Values.revision
  "templates" (include "sidecar-injector.templateFiles" . | fromJson)
  "disabledLabel" .Values.webhook.disabledLabel
  "namespaceOptIn" .Values.webhook.namespaceOptIn.enabled
-}}
{{- /* Only when on, so that the fingerprint of an installation without it stays. */ -}}
{{- if .Values.webhook.namespaceOptIn.required -}}
{{- $_ := set $inputs "namespaceRequired" true -}}
{{- end -}}
{{- toJson $inputs | sha256sum -}}
{{- end -}}

{{/* Name of the Secret holding the serving certificate. */}}
{{- define "sidecar-injector.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
{{- .Values.certificates.existingSecret.name -}}
{{- else if eq .Values.certificates.mode "selfManaged" -}}
{{- /* Not <fullname>-tls: an upgrade from selfSigned replaces that kubernetes.io/tls Secret
with this Opaque one, whose type it could not change. */ -}}
{{- printf "%s-certificates" (include "sidecar-injector.fullname" .) -}}
{{- else -}}
{{- printf "%s-tls" (include "sidecar-injector.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Host names and IPs the serving certificate is valid for, as YAML {dns: [...], ips: [...]}. */}}
{{- define "sidecar-injector.certSANs" -}}
{{- $svc := include "sidecar-injector.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) -}}
{{- $ips := list -}}
{{- with .Values.webhook.url -}}
{{- $hostport := (urlParse .).host -}}
{{- $host := regexFind "^[^:]+" $hostport -}}
{{- if hasPrefix "[" $hostport -}}
{{- $ips = append $ips (regexFind "^\\[[^]]+" $hostport | trimPrefix "[") -}}
{{- else if regexMatch "^[0-9]+(\\.[0-9]+){3}$" $host -}}
{{- $ips = append $ips $host -}}
{{- else if $host -}}
{{- $dns = append $dns $host -}}
{{- end -}}
{{- end -}}
{{- dict "dns" $dns "ips" $ips | toYaml -}}
{{- end -}}

{{/*
The chart-made CA and serving certificate (certificates.mode=selfSigned), as base64 strings in
.Values.__selfSigned {ca, crt, key}. Made once per render and shared by the Secret and both
webhook configurations; on upgrade the existing Secret is reused (lookup), so the caBundle does
not change on every upgrade. `helm template` has no cluster: lookup is empty and new
certificates are made on every run.
*/}}
{{- define "sidecar-injector.selfSigned" -}}
{{- if not (hasKey .Values "__selfSigned") -}}
{{- $name := include "sidecar-injector.tlsSecretName" . -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- $data := dig "data" (dict) $existing -}}
{{- if and (hasKey $data "ca.crt") (hasKey $data "tls.crt") (hasKey $data "tls.key") -}}
{{- $_ := set .Values "__selfSigned" (dict "ca" (index $data "ca.crt") "crt" (index $data "tls.crt") "key" (index $data "tls.key")) -}}
{{- else -}}
{{- $days := int .Values.certificates.selfSigned.validityDays -}}
{{- $sans := include "sidecar-injector.certSANs" . | fromYaml -}}
{{- $ca := genCA (printf "%s-ca" (include "sidecar-injector.fullname" .)) $days -}}
{{- $cn := printf "%s.%s.svc" (include "sidecar-injector.fullname" .) .Release.Namespace -}}
{{- $cert := genSignedCert $cn $sans.ips $sans.dns $days $ca -}}
{{- $_ := set .Values "__selfSigned" (dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* base64 CA bundle for clientConfig.caBundle; empty when cert-manager injects it. */}}
{{- define "sidecar-injector.caBundle" -}}
{{- $mode := .Values.certificates.mode -}}
{{- if eq $mode "selfSigned" -}}
{{- include "sidecar-injector.selfSigned" . -}}
{{- .Values.__selfSigned.ca -}}
{{- else if eq $mode "existingSecret" -}}
{{- $bundle := .Values.certificates.existingSecret.caBundle -}}
{{- if contains "-----BEGIN" $bundle -}}
{{- $bundle | b64enc -}}
{{- else -}}
{{- $bundle | nospace -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the webhooks never see: the system ones, the release's own, config.excludedNamespaces. */}}
{{- define "sidecar-injector.excludedNamespaces" -}}
{{- $ns := concat (list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace) .Values.config.excludedNamespaces -}}
{{- $ns | uniq | toYaml -}}
{{- end -}}

{{/*
The templates the ConfigMap carries, as JSON {NAME.yaml.j2: source} (JSON: toYaml would cut the
last template's final newline): the repository's templates/
folder (files/templates links to it) and then values.extraTemplates, which may replace them.
*/}}
{{- define "sidecar-injector.templateFiles" -}}
{{- $files := dict -}}
{{- range $path, $_ := .Files.Glob "files/templates/*.yaml.j2" -}}
{{- $_ := set $files (base $path) ($.Files.Get $path) -}}
{{- end -}}
{{- range $name, $source := .Values.extraTemplates -}}
{{- $_ := set $files (printf "%s.yaml.j2" $name) $source -}}
{{- end -}}
{{- $files | toJson -}}
{{- end -}}

{{/*
"true" when Windows pods can be filtered out before they reach the server: skip.windows is on
and no default template may set supportsWindows to anything but false. (A pod that names its
templates still goes to the server, which decides per template.)
*/}}
{{- define "sidecar-injector.skipWindowsEarly" -}}
{{- if .Values.config.skip.windows -}}
{{- $files := include "sidecar-injector.templateFiles" . | fromJson -}}
{{- $supports := false -}}
{{- range .Values.config.defaultTemplates -}}
{{- range regexFindAll "(?m)^[ \\t]*supportsWindows:.*$" (get $files (printf "%s.yaml.j2" .)) -1 -}}
{{- if not (regexMatch "^supportsWindows:[ \\t]*false[ \\t]*(#.*)?$" (trim .)) -}}
{{- $supports = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $supports -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Checks that values the schema cannot express. Included by the ConfigMap, always rendered. */}}
{{- define "sidecar-injector.checks" -}}
{{- if not (has .Values.mode (list "webhook" "policy")) -}}
{{- fail (printf "mode must be webhook or policy, not %q" .Values.mode) -}}
{{- end -}}
{{- if and (include "sidecar-injector.webhookMode" .) (not (include "sidecar-injector.inCluster" .)) (not .Values.webhook.url) -}}
{{- fail "replicaCount is 0 or deployment.enabled is false, but webhook.url is empty: nothing would answer the webhooks. Set webhook.url to the out-of-cluster server, or run the server in the cluster." -}}
{{- end -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
{{- if and (include "sidecar-injector.inCluster" .) (not .Values.certificates.existingSecret.name) -}}
{{- fail "certificates.mode=existingSecret needs certificates.existingSecret.name: the kubernetes.io/tls Secret the server serves with." -}}
{{- end -}}
{{- if and (not .Values.webhook.url) (not .Values.certificates.existingSecret.caBundle) -}}
{{- fail "certificates.mode=existingSecret needs certificates.existingSecret.caBundle: the CA the apiserver verifies the server's certificate with." -}}
{{- end -}}
{{- end -}}
{{- if and .Values.outdated.rbac.restart (not .Values.outdated.rbac.report) -}}
{{- fail "outdated.rbac.restart needs outdated.rbac.report: `outdated --restart` first reads what the report reads." -}}
{{- end -}}
{{- with .Values.autoscaling -}}
{{- if and .enabled (lt (int .maxReplicas) (int .minReplicas)) -}}
{{- fail (printf "autoscaling.maxReplicas (%d) is below autoscaling.minReplicas (%d)." (int .maxReplicas) (int .minReplicas)) -}}
{{- end -}}
{{- if and .enabled $.Values.podDisruptionBudget.enabled (not (kindIs "string" $.Values.podDisruptionBudget.minAvailable)) (ge (int $.Values.podDisruptionBudget.minAvailable) (int .minReplicas)) -}}
{{- fail (printf "podDisruptionBudget.minAvailable (%d) must be below autoscaling.minReplicas (%d): otherwise no drain can evict a server." (int $.Values.podDisruptionBudget.minAvailable) (int .minReplicas)) -}}
{{- end -}}
{{- end -}}
{{- range $name, $_ := .Values.extraTemplates -}}
{{- if hasSuffix ".yaml.j2" $name -}}
{{- fail (printf "extraTemplates key %q: the key is the template's bare name, %q (the chart adds .yaml.j2 to make the file name)." $name (trimSuffix ".yaml.j2" $name)) -}}
{{- end -}}
{{- end -}}
{{- $files := include "sidecar-injector.templateFiles" . | fromJson -}}
{{- $known := list -}}
{{- range $file := keys $files | sortAlpha -}}
{{- $known = append $known (trimSuffix ".yaml.j2" $file) -}}
{{- end -}}
{{- range .Values.config.defaultTemplates -}}
{{- if not (hasKey $files (printf "%s.yaml.j2" .)) -}}
{{- fail (printf "config.defaultTemplates names %q, but there is no such template (known: %s). Add it to extraTemplates or remove it." . (join ", " $known)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The alert rule groups (a YAML object with `groups`), from files/alerts.yaml: the
thresholds, the selector of the injector's series, and each alert's `for`, severity, extra
labels and runbook_url filled in from prometheusRule. One source for the PrometheusRule, the
promtool tests and the node suite's Prometheus (charts/prometheus-rules.py). */}}
{{- define "sidecar-injector.alertGroups" -}}
{{- $v := .Values.prometheusRule -}}
{{- $selector := $v.selector | default (printf "job=%q,namespace=%q" (include "sidecar-injector.fullname" .) .Release.Namespace) -}}
{{- $latency := mulf (float64 .Values.webhook.timeoutSeconds) (float64 $v.latencyTimeoutFraction) -}}
{{- $text := .Files.Get "files/alerts.yaml"
  | replace "__SELECTOR__" $selector
  | replace "__ERROR_RATIO__" (toString $v.errorRatio)
  | replace "__DENIAL_RATIO__" (toString $v.denialRatio)
  | replace "__LATENCY_SECONDS__" (toString $latency)
  | replace "__EXPIRY_SECONDS__" (toString (mulf (float64 $v.certificateExpiryDays) 86400 | int64)) -}}
{{- $groups := fromYaml $text -}}
{{- $runbook := $v.runbookBaseUrl | default "README.md" -}}
{{- range $group := $groups.groups -}}
{{- range $rule := $group.rules -}}
{{- $own := get $v.alerts $rule.alert | default dict -}}
{{- with $own.for -}}{{- $_ := set $rule "for" . -}}{{- end -}}
{{- $labels := merge (dict) $v.alertLabels (dict "severity" ($own.severity | default "warning")) -}}
{{- $_ := set $rule "labels" $labels -}}
{{- $_ := set $rule.annotations "runbook_url" (printf "%s#%s" $runbook (lower $rule.alert)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $groups -}}
{{- end -}}

{{/* Whether the server keeps the backstop in step with its configuration (`serve --backstop`):
"true" or "". The in-cluster server does, with policies.backstop.enabled true, or auto where the
cluster serves ValidatingAdmissionPolicy; not when policies.backstop.manifest brings a backstop
of its own (rendered as it is). */}}
{{- define "sidecar-injector.backstopSync" -}}
{{- $p := .Values.policies.backstop -}}
{{- $vap := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
{{- if and (or (include "sidecar-injector.inCluster" .) (include "sidecar-injector.policyKeeper" .)) (not $p.manifest) -}}
{{- if or (eq (toString $p.enabled) "true") (and (eq (toString $p.enabled) "auto") $vap) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* Policy mode with no policies.mutating.manifest: "true" or "". One pod, off the admission
path (`serve --policies-only`), applies the MutatingAdmissionPolicy (and the backstop)
exported from the release's ConfigMap and keeps them in step on every reload; no webhook,
Service or certificate. */}}
{{- define "sidecar-injector.policyKeeper" -}}
{{- if and (not (include "sidecar-injector.webhookMode" .)) .Values.deployment.enabled (not .Values.policies.mutating.manifest) -}}true{{- end -}}
{{- end -}}

{{/* Whether a pod of this release runs `serve` (the webhook server, or the policy keeper). */}}
{{- define "sidecar-injector.runsPods" -}}
{{- if or (include "sidecar-injector.inCluster" .) (include "sidecar-injector.policyKeeper" .) -}}true{{- end -}}
{{- end -}}

{{/* The MutatingAdmissionPolicy's name, as `export mutating` names it: from the revision. */}}
{{- define "sidecar-injector.mutatingPolicyName" -}}
{{- if .Values.revision -}}sidecar-injector-{{ .Values.revision }}{{- else -}}sidecar-injector{{- end -}}
{{- end -}}

{{/* The backstop's object names, as `export backstop` names them: from the revision. */}}
{{- define "sidecar-injector.backstopName" -}}
{{ include "sidecar-injector.mutatingPolicyName" . }}-backstop
{{- end -}}
