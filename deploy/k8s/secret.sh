#!/bin/sh
# Prints the platform's Secrets (Kubernetes manifests), one per consumer with only the keys it
# reads, and console and Flower credentials generated on this machine; none ships in this
# repository. Use it once:
#
#   DATABASE_URL='postgresql+psycopg://rangekeeper:PW@postgres:5432/rangekeeper' \
#   BROKER_URL='amqp://rangekeeper:PW@rabbitmq:5672/rangekeeper' \
#   REDIS_URL='redis://:PW@redis:6379/0' \
#   sh deploy/k8s/secret.sh | kubectl create -f -
#
#   rangekeeper-migrate  DATABASE_URL                  the migration Job (migrate.yaml)
#   rangekeeper-worker   DATABASE_URL BROKER_URL REDIS_URL      workers and control workers
#   rangekeeper-beat     DATABASE_URL BROKER_URL REDIS_URL      beat
#   rangekeeper-console  DATABASE_URL BROKER_URL REDIS_URL CONSOLE_USER CONSOLE_PASSWORD
#                        CONSOLE_SECRET                          the console
#   rangekeeper-flower   BROKER_URL FLOWER_BASIC_AUTH            Flower
#
# REDIS_URL defaults to redis://redis:6379/0 (a Redis without a password, in the namespace).
# MIGRATE_DATABASE_URL (default DATABASE_URL) lets the Job use a user that may change the schema
# while the others use one that may only read and write rows. CONSOLE_USER and FLOWER_USER
# default to admin. The generated passwords are printed nowhere else: read one back with
#   kubectl get secret rangekeeper-console -o jsonpath='{.data.CONSOLE_PASSWORD}' | base64 -d
# Values go under `data:` base64-encoded, so any character in a URL is safe.
set -eu
: "${DATABASE_URL:?set DATABASE_URL to the platform database URL (with its real password)}"
: "${BROKER_URL:?set BROKER_URL to the broker URL (with its real password)}"
REDIS_URL=${REDIS_URL:-redis://redis:6379/0}
MIGRATE_DATABASE_URL=${MIGRATE_DATABASE_URL:-$DATABASE_URL}
CONSOLE_USER=${CONSOLE_USER:-admin}
FLOWER_USER=${FLOWER_USER:-admin}

# $1 random bytes, as URL-safe text (no '/', '+' or '=').
random() { head -c "$1" /dev/urandom | base64 | tr -d '\n/+='; }
b64() { printf '%s' "$1" | base64 | tr -d '\n'; }
# The head of Secret $1, for component $2.
secret() {
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n' "$1"
  printf '  labels: {app: rangekeeper, component: %s}\ntype: Opaque\ndata:\n' "$2"
}
stores() {
  echo "  DATABASE_URL: $(b64 "$DATABASE_URL")"
  echo "  BROKER_URL: $(b64 "$BROKER_URL")"
  echo "  REDIS_URL: $(b64 "$REDIS_URL")"
}

secret rangekeeper-migrate migrate
echo "  DATABASE_URL: $(b64 "$MIGRATE_DATABASE_URL")"
secret rangekeeper-worker worker
stores
secret rangekeeper-beat beat
stores
secret rangekeeper-console console
stores
echo "  CONSOLE_USER: $(b64 "$CONSOLE_USER")"
echo "  CONSOLE_PASSWORD: $(b64 "$(random 24)")"
# One secret for every console replica keeps sessions valid across them.
echo "  CONSOLE_SECRET: $(b64 "$(random 48)")"
secret rangekeeper-flower flower
echo "  BROKER_URL: $(b64 "$BROKER_URL")"
echo "  FLOWER_BASIC_AUTH: $(b64 "$FLOWER_USER:$(random 24)")"
