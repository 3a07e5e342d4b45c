#!/usr/bin/env bash
# The include graph between folders has no arrow up and no cycle (issue 14).
# Floors, lowest first: common/ <- model/ <- calibrate/ <- planner/, and
# model/ <- backend/; inside backend/: optim/ <- cuda/ <- runtime/ <- comm/ <-
# engine/ <- the mains. A file may include its own folder and the floors below.
set -u
cd "$(dirname "$0")/.."
fail=0
allowed() {  # allowed FOLDER INCLUDED_FOLDER
  case "$1" in
    common) [[ "$2" == common ]] ;;
    model) [[ "$2" =~ ^(common|model)$ ]] ;;
    calibrate) [[ "$2" =~ ^(common|model|calibrate)$ ]] ;;
    planner) [[ "$2" =~ ^(common|model|calibrate|planner)$ ]] ;;
    backend/optim) [[ "$2" =~ ^(common|model|backend/optim)$ ]] ;;
    backend/cuda) [[ "$2" =~ ^(common|model|backend/optim|backend/cuda)$ ]] ;;
    backend/runtime) [[ "$2" =~ ^(common|model|backend/optim|backend/cuda|backend/runtime)$ ]] ;;
    backend/comm) [[ "$2" =~ ^(common|model|backend/optim|backend/cuda|backend/runtime|backend/comm)$ ]] ;;
    backend/engine) [[ "$2" =~ ^(common|model|backend/(optim|cuda|runtime|comm|engine))$ ]] ;;
    backend) [[ "$2" =~ ^(common|model|backend/(optim|cuda|runtime|comm|engine))$ ]] ;;
    *) return 1 ;;
  esac
}
checked=0
for f in $(find common model calibrate planner backend -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.inc'); do
  dir=$(dirname "$f")
  while read -r inc; do
    [[ -z "$inc" ]] && continue
    target=$(dirname "$inc")
    checked=$((checked + 1))
    if ! allowed "$dir" "$target"; then
      echo "FAIL: $f includes \"$inc\" ($dir -> $target is not a downward arrow)"
      fail=1
    fi
  done < <(sed -n 's/^#include "\([a-z_]*\/[a-z_/]*\.[a-z]*\)".*/\1/p' "$f")
done
echo "include graph: $checked project includes checked"
exit $fail
