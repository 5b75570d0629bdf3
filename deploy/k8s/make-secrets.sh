#!/usr/bin/env bash
# Create the Secrets the manifests read, with random values, unless they exist (never rotates by accident).
#   kfactory-nats   one password per NATS user: planner coder compiler verifier benchmarker memory admin
#   kfactory-redis  password (Redis AUTH)
#   kfactory-grpc   token (the bearer token the planner's and memory's gRPC services demand)
# Not here: kfactory-llm (api-key), the LLM endpoint's key, which only you have and the coder reads when it
# exists (deploy/k8s/README.md, Secrets).
# Usage: deploy/k8s/make-secrets.sh [namespace]   (default kfactory; needs kubectl and a cluster)
set -euo pipefail
ns="${1:-kfactory}"
rand() { python3 -c 'import secrets; print(secrets.token_urlsafe(24))'; }

kubectl get namespace "$ns" >/dev/null 2>&1 || kubectl create namespace "$ns"
create() {  # name key...
  local name=$1; shift
  if kubectl -n "$ns" get secret "$name" >/dev/null 2>&1; then
    echo "secret $name exists: left as it is"; return
  fi
  local args=()
  for key in "$@"; do args+=("--from-literal=$key=$(rand)"); done
  kubectl -n "$ns" create secret generic "$name" "${args[@]}" >/dev/null
  echo "secret $name created"
}
create kfactory-nats planner coder compiler verifier benchmarker memory admin
create kfactory-redis password
create kfactory-grpc token
