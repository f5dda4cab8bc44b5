#!/usr/bin/env bash
# Copy the WMT14 EN-DE sample that bench/gpu_check.sh needs into a folder of this checkout, so that it
# can travel to a GPU machine with the checkout (the ../shared/data beside it does not travel).
#
#   bash bench/gpu_data.sh [SHARED_DATA] [DEST]     # defaults: ../shared/data and .gpu-data
#
# Copies wmt14-en-de/{train,newstest2013,newstest2014}.{en,de} (about 8 MB). DEST must be ignored by
# git (it is data, not source): the script says how if it is not.
set -euo pipefail
cd "$(dirname "$0")/.."

shared=${1:-../shared/data}
dest=${2:-${GPU_DATA:-.gpu-data}}
files=(train newstest2013 newstest2014)

for name in "${files[@]}"; do
    for lang in en de; do
        if [[ ! -f $shared/wmt14-en-de/$name.$lang ]]; then
            echo "error: $shared/wmt14-en-de/$name.$lang not found (see ../shared/data/README.md)" >&2
            exit 1
        fi
    done
done
mkdir -p "$dest/wmt14-en-de"
for name in "${files[@]}"; do
    cp -f "$shared/wmt14-en-de/$name".{en,de} "$dest/wmt14-en-de/"
done
echo "copied $(du -sh "$dest" | cut -f1) of WMT14 EN-DE into $dest/wmt14-en-de: ${files[*]} (.en, .de)"

if git check-ignore -q "$dest/wmt14-en-de/train.en" 2>/dev/null; then
    echo "$dest is ignored by git: name it in the device run's carry, e.g. carry=[\"$dest\"]"
else
    echo "$dest is not ignored by git: add it to .git/info/exclude before carrying it, with"
    echo "    echo '/${dest#./}/' >> \"\$(git rev-parse --git-path info/exclude)\""
fi
