{{/*
The webhook entries of each configuration: "pod" (the pod's own label opts it in), with
webhook.namespaceOptIn.enabled "namespace" (its namespace's label `enabled` does) and, with
webhook.namespaceOptIn.required, "required" (its namespace's label `required` does, and an
opt-out there is refused unless exempt). Their selectors cannot overlap, so no pod is sent
twice, and each calls its own path, so the server knows which rule the apiserver applied (a
review carries no namespace labels).
*/}}
{{- define "sidecar-injector.entries" -}}
{{- $entries := list "pod" -}}
{{- if .Values.webhook.namespaceOptIn.enabled -}}
{{- $entries = append $entries "namespace" -}}
{{- end -}}
{{- if .Values.webhook.namespaceOptIn.required -}}
{{- $entries = append $entries "required" -}}
{{- end -}}
{{- $entries | toJson -}}
{{- end -}}

{{/*
A webhook's name: (dict "root" $ "entry" "pod" "base" "inject.sidecar-injector.io").
The namespace and required entries' are prefixed "namespace." and "required.", a revision's
"<revision>.".
*/}}
{{- define "sidecar-injector.webhookName" -}}
{{- $name := .base -}}
{{- if ne .entry "pod" -}}{{- $name = printf "%s.%s" .entry $name -}}{{- end -}}
{{- with .root.Values.revision -}}{{- $name = printf "%s.%s" . $name -}}{{- end -}}
{{- $name -}}
{{- end -}}

{{/*
The fields the mutating and the validating webhook share. One definition, so both see exactly
the same requests: a pod the injector skips is also a pod the validator skips.
Called with (dict "root" $ "path" "/mutate" "entry" "pod"); the namespace and required
entries call PATH/namespace and PATH/required.
*/}}
{{- define "sidecar-injector.webhook.common" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $rev := $v.revision -}}
{{- $path := ternary .path (printf "%s/%s" .path .entry) (eq .entry "pod") -}}
# The server answers in the version it is asked in; apiservers send the first one they know,
# and every supported apiserver knows v1. v1beta1 is kept for old ones.
admissionReviewVersions: ["v1", "v1beta1"]
clientConfig:
  {{- if $v.webhook.url }}
  # webhook.url is set: the server runs outside the cluster and is dialled directly.
  url: {{ printf "%s%s" (trimSuffix "/" $v.webhook.url) $path | quote }}
  {{- else }}
  # The chart's Service; the serving certificate is valid for <service>.<namespace>.svc.
  service:
    name: {{ include "sidecar-injector.fullname" $root }}
    namespace: {{ $root.Release.Namespace }}
    # One server, a path per webhook and entry: /mutate injects, /validate checks; the
    # namespace and required entries' paths end in /namespace and /required, which tells the
    # server which rule applied.
    path: {{ $path }}
    port: {{ $v.service.port }}
  {{- end }}
  {{- with include "sidecar-injector.caBundle" $root }}
  # The CA that signed the serving certificate (certificates.mode={{ $v.certificates.mode }}).
  caBundle: {{ . }}
  {{- else }}
  {{- if eq $v.certificates.mode "certManager" }}
  # No caBundle here: cert-manager's cainjector writes it (see the inject-ca-from annotation).
  {{- else if eq $v.certificates.mode "selfManaged" }}
  # No caBundle here: the server sets it to the CAs it keeps in its Secret, by server-side
  # apply of this field alone (field manager sidecar-injector-certificates), and mends it
  # within one re-check (server.recheckInterval) when an upgrade or a sync resets it.
  {{- else }}
  # No caBundle: the URL's certificate is verified against the apiserver's system roots.
  {{- end }}
  {{- end }}
# Equivalent: a pod sent through any API version that maps to core/v1 pods is still seen,
# converted to v1 (the only version the server decodes).
matchPolicy: Equivalent
{{- if eq .entry "pod" }}
# Opted in by the pod's own label: a pod is sent only when it carries the inject label with the
# value "true"{{ if $rev }} and {{ $v.config.revisionLabel }}={{ $rev }} (this revision){{ else }} and no {{ $v.config.revisionLabel }} label (a pod naming a revision
# belongs to that revision's installation){{ end }}. Other pods never wait on the webhook, so it can
# never block them.
objectSelector:
  matchLabels:
    {{ $v.config.injectLabel }}: "true"
    {{- if $rev }}
    {{ $v.config.revisionLabel }}: {{ $rev | quote }}
  {{- else }}
  matchExpressions:
    - key: {{ $v.config.revisionLabel }}
      operator: DoesNotExist
  {{- end }}
{{- else if eq .entry "namespace" }}
# Opted in by the namespace (below): every pod but those that opt out with the value "false".
objectSelector:
  matchExpressions:
    - key: {{ $v.config.injectLabel }}
      operator: NotIn
      values: ["false"]
{{- else }}
# No objectSelector: the namespace (below) requires sidecars, so a pod that opts out with the
# value "false" is sent too. The injector leaves it alone; the validator refuses it unless its
# service account is exempt (config.required.exempt).
{{- end }}
# Never in the system namespaces (the control plane must not depend on the injector), nor in
# the release namespace (the injector must be able to start its own pods while it is down),
# nor in config.excludedNamespaces (the server would skip them anyway), nor in namespaces
# labelled {{ $v.webhook.disabledLabel }}=true (an opt-out for a whole namespace).
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- include "sidecar-injector.excludedNamespaces" $root | nindent 8 }}
    - key: {{ $v.webhook.disabledLabel }}
      operator: NotIn
      values: ["true"]
    {{- if eq .entry "pod" }}
    {{- $others := list }}
    {{- if $v.webhook.namespaceOptIn.enabled }}{{ $others = append $others "enabled" }}{{ end }}
    {{- if $v.webhook.namespaceOptIn.required }}{{ $others = append $others "required" }}{{ end }}
    {{- with $others }}
    # Namespaces that opt in belong to the {{ if has "enabled" . }}namespace{{ end }}{{ if eq (len .) 2 }} and {{ end }}{{ if has "required" . }}required{{ end }} {{ if eq (len .) 2 }}entries{{ else }}entry{{ end }}: no pod is sent twice.
    - key: {{ $v.config.injectLabel }}
      operator: NotIn
      values: {{ toJson . }}
    {{- end }}
    {{- else }}
    # The namespace opts in{{ if eq .entry "required" }} and requires sidecars{{ end }}, and names {{ if $rev }}this revision{{ else }}no revision (one naming a revision belongs to that
    # revision's installation){{ end }}.
    - key: {{ $v.config.injectLabel }}
      operator: In
      values: [{{ ternary "enabled" "required" (eq .entry "namespace") | quote }}]
    - key: {{ $v.config.revisionLabel }}
      {{- if $rev }}
      operator: In
      values: [{{ $rev | quote }}]
      {{- else }}
      operator: DoesNotExist
      {{- end }}
    {{- end }}
# None: the server only reads the review and answers; it writes nothing anywhere, so dry-run
# requests (kubectl apply --dry-run=server) are sent to it as well.
sideEffects: None
# Short: a pod create waits on this call. Past it the failurePolicy decides.
timeoutSeconds: {{ $v.webhook.timeoutSeconds }}
{{- if $v.webhook.matchConditions.enabled }}
{{- $skipWindows := include "sidecar-injector.skipWindowsEarly" $root }}
{{- if or $v.config.skip.hostNetwork $skipWindows }}
# Pods the server would skip anyway are kept from leaving the apiserver: less latency, and
# they are never blocked by an unreachable server. Both webhooks carry the same conditions.
# They never look at dryRun or the user, only at the pod.
matchConditions:
  {{- if $v.config.skip.hostNetwork }}
  # config.skip.hostNetwork: the server skips hostNetwork pods.
  - name: not-host-network
    expression: "!(has(object.spec.hostNetwork) && object.spec.hostNetwork)"
  {{- end }}
  {{- if $skipWindows }}
  # config.skip.windows, and no default template supports Windows: the server skips Windows
  # pods (spec.os.name or the kubernetes.io/os node selector) that use the default templates.
  # A pod naming its own templates goes to the server, which decides per template.
  - name: not-windows-with-default-templates
    expression: >-
      !(((has(object.spec.os) && object.spec.os.name == 'windows')
      || (has(object.spec.nodeSelector) && 'kubernetes.io/os' in object.spec.nodeSelector
      && object.spec.nodeSelector['kubernetes.io/os'] == 'windows'))
      && !(has(object.metadata.annotations)
      && {{ $v.config.templatesAnnotation | squote }} in object.metadata.annotations))
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}
