#!/usr/bin/env bash
# benchmarks/gpu/matrix.sh for several profiles in turn, inside one call of limited length: at
# DEADLINE_S seconds the runs under way are interrupted (finished runs are kept, the server is left
# up), and the same command in the next call carries on. When every profile is done: the analysis
# of each workload against BASELINE (baseline). Each call packs what exists into DEST (the device's $OUT):
# matrix-small.tar.xz (records, summaries, reports) and raw-WORKLOAD-LABEL.tar.xz (each label's runs, whole).
# Usage: DEADLINE_S=540 bash benchmarks/gpu/matrix_pass.sh baseline,optimized /tmp/mx DEST
set -uo pipefail
cd "$(dirname "$0")/../.."
profiles=${1:?profiles}; out=${2:?out dir}; dest=${3:?dest dir}
py=${SUITE_PYTHON:-python3}
[[ -d /tmp/site ]] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1
(sleep "${DEADLINE_S:-540}"; while :; do pkill -INT -f 'launch[.]sweep|benchmarks/agreement[.]py'; sleep 2; done) &
watchdog=$!
all_done=1
for p in ${profiles//,/ }; do
  bash benchmarks/gpu/matrix.sh "$p" "$out" || { all_done=; break; }
done
kill "$watchdog" 2>/dev/null
if [[ -n "$all_done" ]]; then
  for w in fixed mixed; do
    [[ -d "$out/$w" ]] && "$py" -m analysis "$out/$w" --baseline "${BASELINE:-baseline}" --bootstrap "${BOOTSTRAP:-1000}" > "$out/analysis-$w.log" 2>&1
  done
  echo "matrix: all profiles done; analysis in $out/{fixed,mixed}"
fi
mkdir -p "$dest"
base=$(dirname "$out") name=$(basename "$out")
tar -C "$base" -cf - --exclude='samples-*' --exclude='requests-*' --exclude='client-*' --exclude='raw.tar.xz' \
  --exclude='profiles' "$name" | xz -T0 -3 > "$dest/matrix-small.tar.xz"
for d in "$out"/fixed/*/ "$out"/mixed/*/; do  # the raw rows, one file per workload and label (size limits)
  ls -d "$d"c* "$d"rate* >/dev/null 2>&1 || continue  # a label's runs, not the analysis's own folders
  rel=${d#"$base"/}; tag=$(basename "$(dirname "$d")")-$(basename "$d")
  tar -C "$base" -cf - "${rel%/}" | xz -T0 -3 > "$dest/raw-$tag.tar.xz"
done
ls -la "$dest"
