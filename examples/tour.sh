#!/usr/bin/env bash
# Every command of README's tour, against a running gateway on its embedded defaults:
#   modelgate serve &  bash examples/tour.sh [BASE_URL]
# Run from anywhere; each call must succeed (curl -f), or the tour stops there.
set -euo pipefail
cd "$(dirname "$0")"
B=${1:-http://127.0.0.1:8080}
KEY=${MODELGATE_DEMO_KEY:-sk-demo-key}
curl() { command curl -fsS --max-time 60 "$@"; echo; }
json() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }

# message format: x-api-key and msgapi-version
curl $B/v1/messages -H "x-api-key: $KEY" -H 'msgapi-version: 2023-06-01' \
  -H 'content-type: application/json' \
  -d '{"model":"msgmodel-sonnet-4-5","max_tokens":256,"messages":[{"role":"user","content":"Hello"}]}'

# ... streamed, event by event
curl -N $B/v1/messages -H "x-api-key: $KEY" -H 'msgapi-version: 2023-06-01' -H 'content-type: application/json' \
  -d '{"model":"msgmodel-sonnet-4-5","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"Hello"}]}'

# content-generation format: ?key=
curl "$B/v1beta/models/genmodel-2.0-flash:generateContent?key=$KEY" -H 'content-type: application/json' \
  -d '{"contents":[{"parts":[{"text":"Hello"}]}]}'
curl -N "$B/v1beta/models/genmodel-2.0-flash:streamGenerateContent?alt=sse&key=$KEY" -H 'content-type: application/json' \
  -d '{"contents":[{"parts":[{"text":"Hello"}]}]}'

# response format: Bearer; previous_response_id chains come back to the same channel
RESPONSE_ID=$(curl $B/v1/responses -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
  -d '{"model":"respmodel-4o","input":"Hello"}' | json '["id"]')
curl $B/v1/responses -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
  -d "{\"model\":\"respmodel-4o\",\"input\":\"And again\",\"previous_response_id\":\"$RESPONSE_ID\"}"
curl $B/v1/responses/$RESPONSE_ID -H "Authorization: Bearer $KEY"

# chat completions: Bearer; a stream is charged its usage whether or not it asks for it
curl $B/v1/chat/completions -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
  -d '{"model":"respmodel-4o","messages":[{"role":"user","content":"Hello"}]}'
curl -N $B/v1/chat/completions -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
  -d '{"model":"respmodel-4o","stream":true,"messages":[{"role":"user","content":"Hello"}]}'

# images
curl $B/v1/images/generations -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
  -d '{"model":"imagegen-2","prompt":"a lighthouse","size":"1024x1024"}' | cut -c1-300
curl $B/v1/images/edits -H "Authorization: Bearer $KEY" \
  -F model=imagegen-2 -F prompt='make it blue' -F 'image[]=@photo.png' | cut -c1-300

# video tasks: submit, poll until done, download (Range and HEAD work too)
TASK_ID=$(curl $B/v1/video/generations -H "Authorization: Bearer $KEY" -H 'content-type: application/json' \
  -d '{"model":"videogen-3.0-generate-001","prompt":"waves at dusk"}' | json '["task_id"]')
for _ in $(seq 60); do
  STATUS=$(curl $B/v1/video/generations/$TASK_ID -H "Authorization: Bearer $KEY" | json '["data"]["status"]')
  [ "$STATUS" = succeeded ] && break || sleep 1
done
curl -o video.mp4 $B/v1/videos/$TASK_ID/content -H "Authorization: Bearer $KEY"

# account: 2FA login and a payment webhook (no gateway key)
curl $B/api/user/login/2fa -H 'content-type: application/json' -d '{}'
curl $B/api/stripe/webhook -H 'Stripe-Signature: t=1,v1=...' --data-binary @event.json

# the models this key may use, in each SDK's shape
curl $B/v1/models -H "Authorization: Bearer $KEY" | cut -c1-300

curl $B/healthz; curl $B/readyz
rm -f video.mp4
echo "tour: every call succeeded"
