#!/usr/bin/env bash
# make lint: every commit since the rule began (issue 26) has a subject of at most 72
# characters; the why and the numbers go in the body. A clone without that history (a
# shallow CI checkout) has nothing to check.
set -euo pipefail
RULE_SINCE=aed93d0  # the first commit written under the rule
MAX=72
cd "$(dirname "$0")/.."
if ! git cat-file -e "$RULE_SINCE^{commit}" 2>/dev/null; then
  echo "commit subjects: $RULE_SINCE is not in this clone; nothing to check" >&2
  exit 0
fi
long=$(git log --no-merges --format='%h%x09%s' "$RULE_SINCE^..HEAD" |
  awk -F'\t' -v max="$MAX" 'length($2) > max { print $1, $2 }')
if [ -n "$long" ]; then
  echo "commit subjects over $MAX characters (keep the subject to what changed; the why goes in the body):" >&2
  echo "$long" >&2
  exit 1
fi
