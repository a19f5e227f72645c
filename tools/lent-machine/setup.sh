# Sourced on the lent machine: TVM from .lent (once per machine), wheels from .lent2, tvm_ext from
# the working tree. No pip build there (its system Python refuses an editable install), so
# tvm_ext.rules / tvm_ext.postprocs are mapped by links as setup.py's package_dir does.
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/tvm/lib/libtvm_compiler.so ]; then
  mkdir -p /tmp/site && tar xJf .lent/tvm-rest.tar.xz -C /tmp/site \
    && xz -dc .lent/libtvm_compiler.xz > /tmp/site/tvm/lib/libtvm_compiler.so \
    && chmod +x /tmp/site/tvm/lib/libtvm_compiler.so || echo "SETUP: extract failed"
fi
for w in .lent2/*.whl; do
  [ -e "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --break-system-packages --target /tmp/site "$w"
done
[ -e tvm_ext/rules ] || ln -s ../rules tvm_ext/rules
[ -e tvm_ext/postprocs ] || ln -s ../postprocs tvm_ext/postprocs
mkdir -p /tmp/bin
printf '#!/bin/bash\nPYTHONPATH=%s:/tmp/site exec python3 -m tvm_ext "$@"\n' "$PWD" > /tmp/bin/tvm-ext
chmod +x /tmp/bin/tvm-ext
export PATH=/tmp/bin:$PATH PYTHONPATH=$PWD:/tmp/site
