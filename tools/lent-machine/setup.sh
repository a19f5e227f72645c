# Sourced on the lent machine, in every call: stages the parts of TVM that this call carried
# (.lent in call 1, .lent2 in call 2: pack.sh) under $LENT_ROOT (default /tmp, which stays while
# the machine is warm: 30 s between calls) and unpacks TVM once all parts are there; wheels from
# .lent2; tvm_ext from the working tree. No pip build there (its system Python refuses an editable
# install), so tvm_ext.rules / tvm_ext.postprocs are mapped by links as setup.py's package_dir does.
# Sets LENT_TVM=1 when TVM is ready, 0 while parts are still missing (after call 1).
# LENT_DRY=1 (rehearse.py, here): stage and test the archives (xz -t), install and change nothing.
export PYTHONUNBUFFERED=1
LENT_ROOT=${LENT_ROOT:-/tmp}
P=$LENT_ROOT/lent-parts S=$LENT_ROOT/site
mkdir -p "$P" "$S"
for f in .lent/* .lent2/*; do [ -e "$f" ] && cp -n "$f" "$P/"; done
LENT_TVM=0
if [ -f "$S/tvm/lib/libtvm_compiler.so" ]; then
  LENT_TVM=1
elif [ -f "$P/libtvm_compiler.xz.00" ] && [ -f "$P/libtvm_compiler.xz.01" ] && [ -f "$P/tvm-rest.tar.xz" ]; then
  if [ "${LENT_DRY:-0}" = 1 ]; then
    cat "$P"/libtvm_compiler.xz.0* | xz -t && xz -t "$P/tvm-rest.tar.xz" && ls "$P"/*.whl >/dev/null \
      && LENT_TVM=1 && echo "SETUP (dry run): TVM's parts complete and intact: $(ls "$P" | tr '\n' ' ')"
  else
    tar xJf "$P/tvm-rest.tar.xz" -C "$S" \
      && cat "$P"/libtvm_compiler.xz.0* | xz -dc > "$S/tvm/lib/libtvm_compiler.so" \
      && chmod +x "$S/tvm/lib/libtvm_compiler.so" && LENT_TVM=1 || echo "SETUP: extract failed"
    for w in "$P"/*.whl; do
      [ -e "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --break-system-packages --target "$S" "$w"
    done
  fi
else
  echo "SETUP: TVM staged, parts so far: $(ls "$P" | tr '\n' ' ')"
fi
export LENT_TVM
if [ "${LENT_DRY:-0}" != 1 ]; then
  [ -e tvm_ext/rules ] || ln -s ../rules tvm_ext/rules
  [ -e tvm_ext/postprocs ] || ln -s ../postprocs tvm_ext/postprocs
  mkdir -p "$LENT_ROOT/bin"
  printf '#!/bin/bash\nPYTHONPATH=%s:%s exec python3 -m tvm_ext "$@"\n' "$PWD" "$S" > "$LENT_ROOT/bin/tvm-ext"
  chmod +x "$LENT_ROOT/bin/tvm-ext"
  export PATH=$LENT_ROOT/bin:$PATH PYTHONPATH=$PWD:$S
fi
