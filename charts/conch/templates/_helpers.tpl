{{/* Names, labels and the pieces every conch container shares. */}}

{{- define "conch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "conch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; pass (dict "root" $ "component" "gateway"). */}}
{{- define "conch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "conch.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "conch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "conch.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- if .group }}
conch.io/worker-group: {{ .group }}
{{- end }}
{{- end -}}

{{- define "conch.gatewayName" -}}
{{- printf "%s-gateway" (include "conch.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "conch.redisName" -}}
{{- printf "%s-redis" (include "conch.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The image; pass (dict "root" $ "suffix" "-gpu"). */}}
{{- define "conch.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag -}}
{{- printf "%s:%s%s" .root.Values.image.repository $tag (.suffix | default "") -}}
{{- end -}}

{{/* The Secret and key that hold REDIS_URL. */}}
{{- define "conch.redisSecretName" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.existingSecret -}}
{{- .Values.externalRedis.existingSecret -}}
{{- else -}}
{{- include "conch.redisName" . -}}
{{- end -}}
{{- end -}}

{{- define "conch.redisSecretKey" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.existingSecret -}}
{{- .Values.externalRedis.existingSecretKey -}}
{{- else -}}
REDIS_URL
{{- end -}}
{{- end -}}

{{- define "conch.restrictedSecretName" -}}
{{- default (printf "%s-restricted-apis" (include "conch.fullname" .)) .Values.restrictedApis.existingSecret -}}
{{- end -}}

{{/* The model repository folder every conch process is given. */}}
{{- define "conch.repositoryPath" -}}
{{- if eq .Values.modelRepository.source "volume" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.modelRepository.volume.mountPath) .Values.modelRepository.volume.subPath | trimSuffix "/" -}}
{{- else if eq .Values.modelRepository.source "image" -}}
{{- .Values.modelRepository.imagePath -}}
{{- else -}}
{{- fail (printf "modelRepository.source must be image or volume, not %q" .Values.modelRepository.source) -}}
{{- end -}}
{{- end -}}

{{- define "conch.repositoryClaim" -}}
{{- default (printf "%s-models" (include "conch.fullname" .)) .Values.modelRepository.volume.existingClaim -}}
{{- end -}}

{{/* Flags of every conch server process (not sync): the repository, model control and
the SIGTERM drain. As YAML list items. */}}
{{- define "conch.commonArgs" -}}
- --model-repository
- {{ include "conch.repositoryPath" . | toJson }}
- --model-control-mode
- {{ .Values.conch.modelControlMode | toJson }}
- --exit-timeout-secs
- {{ .Values.conch.exitTimeoutSecs | toString | toJson }}
{{- range .Values.conch.extraArgs }}
- {{ . | toJson }}
{{- end }}
{{- end -}}

{{/* terminationGracePeriodSeconds: the SIGTERM drain (--exit-timeout-secs), what runs
before SIGTERM (a preStop sleep), and a margin. Pass (dict "root" $ "before" N). */}}
{{- define "conch.terminationGrace" -}}
{{- add (int .root.Values.conch.exitTimeoutSecs) (int (.before | default 0)) (int .root.Values.conch.terminationGraceMarginSecs) -}}
{{- end -}}

{{/* Environment of every conch process: REDIS_URL from its Secret, then conch.env and
the process's own env (a map). Pass (dict "root" $ "env" .Values.gateway.env). */}}
{{- define "conch.env" -}}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "conch.redisSecretName" .root }}
      key: {{ include "conch.redisSecretKey" .root }}
{{- range $name, $value := merge (deepCopy (.env | default dict)) .root.Values.conch.env }}
- name: {{ $name }}
  value: {{ $value | toString | toJson }}
{{- end }}
{{- end -}}

{{/* Volumes and mounts of the model repository (and a writable /tmp). */}}
{{- define "conch.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if eq .Values.modelRepository.source "volume" }}
- name: models
  persistentVolumeClaim:
    claimName: {{ include "conch.repositoryClaim" . }}
{{- end }}
{{- end -}}

{{/* Pass (dict "root" $ "writable" true) for repo-sync. */}}
{{- define "conch.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if eq .root.Values.modelRepository.source "volume" }}
- name: models
  mountPath: {{ .root.Values.modelRepository.volume.mountPath }}
  readOnly: {{ not .writable }}
{{- end }}
{{- end -}}

{{/* Pods that read a volume repository wait until repo-sync has made it (else conch
stops: --model-repository is not a folder). Pass (dict "root" $ "image" <the pod's image>). */}}
{{- define "conch.waitForRepository" -}}
{{- $root := .root -}}
{{- if and (eq $root.Values.modelRepository.source "volume") $root.Values.repoSync.enabled }}
initContainers:
  - name: wait-for-repository
    image: {{ .image }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command: ["sh", "-c", "until [ -d \"$0\" ]; do echo waiting for $0; sleep 2; done", {{ include "conch.repositoryPath" $root | toJson }}]
    securityContext: {{- toYaml $root.Values.securityContext | nindent 6 }}
    volumeMounts: {{- include "conch.volumeMounts" (dict "root" $root) | nindent 6 }}
    resources:
      requests: {cpu: 10m, memory: 16Mi}
      limits: {memory: 64Mi}
{{- end }}
{{- end -}}

{{/* What every conch pod spec starts with. */}}
{{- define "conch.podBasics" -}}
automountServiceAccountToken: false
securityContext: {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A worker group with workers.defaults under it: the group's keys replace the
defaults' (an explicit 0 or empty list included); autoscaling and pdb merge key by key. */}}
{{- define "conch.group" -}}
{{- $defaults := .root.Values.workers.defaults -}}
{{- $g := dict -}}
{{- range $k, $v := $defaults }}{{ $_ := set $g $k $v }}{{ end -}}
{{- range $k, $v := .group }}{{ $_ := set $g $k $v }}{{ end -}}
{{- range $nested := list "autoscaling" "pdb" -}}
{{- $m := dict -}}
{{- range $k, $v := (get $defaults $nested | default dict) }}{{ $_ := set $m $k $v }}{{ end -}}
{{- range $k, $v := (get $.group $nested | default dict) }}{{ $_ := set $m $k $v }}{{ end -}}
{{- $_ := set $g $nested $m -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (toString $g.name)) -}}
{{- fail (printf "workers.groups: name %q must be a DNS label (lower-case letters, digits, '-')" (toString $g.name)) -}}
{{- end -}}
{{- $a := $g.autoscaling -}}
{{- if $a.enabled -}}
{{- if not (and (le 0 (int $a.minReplicas)) (le (int $a.minReplicas) (int $a.maxReplicas)) (lt 0 (int $a.maxReplicas))) -}}
{{- fail (printf "workers.groups[%s].autoscaling: need 0 <= minReplicas <= maxReplicas and maxReplicas >= 1" $g.name) -}}
{{- end -}}
{{- if not (gt (float64 $a.targetPerWorker) 0.0) -}}
{{- fail (printf "workers.groups[%s].autoscaling.targetPerWorker must be above 0" $g.name) -}}
{{- end -}}
{{- end -}}
{{- toJson $g -}}
{{- end -}}

{{/* The --models value of a group: names joined by ',', a ',' inside a name as '\,'. */}}
{{- define "conch.modelsArg" -}}
{{- $escaped := list -}}
{{- range . }}{{ $escaped = append $escaped (replace "," "\\," (toString .)) }}{{ end -}}
{{- join "," $escaped -}}
{{- end -}}

{{/* The --scale-to-zero value of the frontends: the models of every autoscaled group
with minReplicas 0, as a --models list; "*" (every model) when such a group serves every
model; empty when no group scales to zero. Those models read ready with no worker, so a
strictly ready gateway still takes the request that wakes their group. */}}
{{- define "conch.scaleToZeroArg" -}}
{{- $models := list -}}
{{- $every := false -}}
{{- range .Values.workers.groups }}
{{- $g := include "conch.group" (dict "root" $ "group" .) | fromJson }}
{{- if and $g.autoscaling.enabled (eq (int $g.autoscaling.minReplicas) 0) }}
{{- if $g.models }}
{{- range $g.models }}{{ $models = append $models (toString .) }}{{ end }}
{{- else }}
{{- $every = true }}
{{- end }}
{{- end }}
{{- end }}
{{- if $every }}*{{ else }}{{ include "conch.modelsArg" (uniq $models) }}{{ end -}}
{{- end -}}

{{/* The name of the group that runs the batch jobs: its workers take them from
conch.jobs and its scaler counts that queue, or a job submitted while every group is at
zero would never start; every other group's workers get --batch-jobs=false, so no scaler
that does not count a job retires its driver. The group marked jobs: true (exactly one),
else the first. */}}
{{- define "conch.jobsGroup" -}}
{{- $marked := list -}}
{{- range .Values.workers.groups }}
{{- $g := include "conch.group" (dict "root" $ "group" .) | fromJson }}
{{- if $g.jobs }}{{ $marked = append $marked (toString $g.name) }}{{ end }}
{{- end }}
{{- if gt (len $marked) 1 -}}
{{- fail (printf "workers.groups: one group runs the batch jobs (jobs: true), not %d: %s" (len $marked) (join ", " $marked)) -}}
{{- end -}}
{{- if $marked }}{{ first $marked }}{{ else if .Values.workers.groups }}{{ (first .Values.workers.groups).name }}{{ end -}}
{{- end -}}

{{/* The URL KEDA reads for a group's models: GET /queue-depth?model=a&model=b on the
gateway's metrics port, and jobs=1 for the group that runs the batch jobs
(conch.wire.work_owed.queue_depth_url builds the same). Names are escaped as Python's
quote(safe=""): QueryEscape, with its '+' for a space as %20. */}}
{{- define "conch.queueDepthUrl" -}}
{{- $params := list -}}
{{- range .models }}{{ $params = append $params (printf "model=%s" (urlquery (toString .) | replace "+" "%20")) }}{{ end -}}
{{- if .jobs }}{{ $params = append $params "jobs=1" }}{{ end -}}
{{- $base := printf "http://%s.%s.svc:%v/queue-depth" (include "conch.gatewayName" .root) .root.Release.Namespace .root.Values.gateway.ports.metrics -}}
{{- if $params }}{{ printf "%s?%s" $base (join "&" $params) }}{{ else }}{{ $base }}{{ end -}}
{{- end -}}
