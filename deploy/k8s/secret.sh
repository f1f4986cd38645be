#!/bin/sh
# Prints the Secret `rangekeeper-secrets` (a Kubernetes manifest) with console and Flower
# credentials generated on this machine; none ships in this repository. Use it once:
#
#   DATABASE_URL='postgresql+psycopg://rangekeeper:PW@postgres:5432/rangekeeper' \
#   BROKER_URL='amqp://rangekeeper:PW@rabbitmq:5672/rangekeeper' \
#   sh deploy/k8s/secret.sh | kubectl create -f -
#
# CONSOLE_USER and FLOWER_USER default to admin. The generated passwords are printed nowhere:
# read one back with
#   kubectl get secret rangekeeper-secrets -o jsonpath='{.data.CONSOLE_PASSWORD}' | base64 -d
# Values go under `data:` base64-encoded, so any character in a URL is safe.
set -eu
: "${DATABASE_URL:?set DATABASE_URL to the platform database URL (with its real password)}"
: "${BROKER_URL:?set BROKER_URL to the broker URL (with its real password)}"
CONSOLE_USER=${CONSOLE_USER:-admin}
FLOWER_USER=${FLOWER_USER:-admin}

# $1 random bytes, as URL-safe text (no '/', '+' or '=').
random() { head -c "$1" /dev/urandom | base64 | tr -d '\n/+='; }
b64() { printf '%s' "$1" | base64 | tr -d '\n'; }

cat <<MANIFEST
apiVersion: v1
kind: Secret
metadata:
  name: rangekeeper-secrets
  labels: {app: rangekeeper}
type: Opaque
data:
  DATABASE_URL: $(b64 "$DATABASE_URL")
  BROKER_URL: $(b64 "$BROKER_URL")
  FLOWER_BASIC_AUTH: $(b64 "$FLOWER_USER:$(random 24)")
  CONSOLE_USER: $(b64 "$CONSOLE_USER")
  CONSOLE_PASSWORD: $(b64 "$(random 24)")
  # One secret for every console replica keeps sessions valid across them.
  CONSOLE_SECRET: $(b64 "$(random 48)")
MANIFEST
