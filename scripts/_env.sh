# Shared by scripts/*: create .venv if needed and install stockade into it (editable).
# STOCKADE_EXTRAS picks the extras: "dev" (tests, lint, types: scripts/test, scripts/check, the default)
# or "" (only what stockade itself needs: scripts/demo). Re-installs only when pyproject.toml changed
# since the last install of those extras (a dev install also serves a plain one).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
EXTRAS="${STOCKADE_EXTRAS-dev}"
DEV_STAMP="$VENV/.stockade-installed"
BASE_STAMP="$VENV/.stockade-installed-base"
_fresh() { [ -f "$1" ] && [ "$1" -nt "$ROOT/pyproject.toml" ]; }
if [ -n "$EXTRAS" ]; then STAMP="$DEV_STAMP"; SPEC="$ROOT[$EXTRAS]"; else STAMP="$BASE_STAMP"; SPEC="$ROOT"; fi
if ! _fresh "$STAMP" && ! { [ -z "$EXTRAS" ] && _fresh "$DEV_STAMP"; }; then
  echo "stockade: installing into $VENV${EXTRAS:+ (with the $EXTRAS extras)}; once, ~30 s..." >&2
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$SPEC"
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
