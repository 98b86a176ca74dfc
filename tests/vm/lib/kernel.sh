# Debian's stock kernel for the VM: fetched once, cached outside the tree.
# Sourced by tests/vm/run; sets KERNEL_VERSION, KERNEL_VMLINUX and KERNEL_MODULES.
#
# Cache layout (${LINERATE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linerate-vm}):
#   <package>/vmlinux          the uncompressed ELF kernel (qemu boots it through PVH,
#                              about 2 s faster under TCG than the compressed bzImage)
#   <package>/lib/modules/...  every module of the package (about 400 MB), so a new
#                              scenario can load any module without a new download
#   <package>/ok               written last: a cache entry without it is rebuilt
# Removing the cache directory is always safe; the next run fetches again.

VM_CACHE=${LINERATE_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linerate-vm}

# Prints the name of the kernel package linux-image-amd64 currently depends on
# (e.g. linux-image-6.1.0-56-amd64). `apt-cache show` would list several versions.
kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1=="Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}'
}

# Writes the ELF kernel found inside a compressed vmlinuz ($1) to $2. The bzImage
# holds the kernel as one compressed stream after a small decompressor: try each
# compression magic at each offset until one decompresses to an ELF file.
kernel_extract_vmlinux() {
    local vmlinuz=$1 out=$2 magic tool off
    for pair in '\xfd7zXZ\x00:xz -dc --single-stream' '\x28\xb5\x2f\xfd:zstd -dcq' \
        '\x1f\x8b\x08:gzip -dc'; do
        magic=${pair%%:*}
        tool=${pair#*:}
        command -v "${tool%% *}" >/dev/null 2>&1 || continue
        for off in $(LC_ALL=C grep -obUaP "$magic" "$vmlinuz" | cut -d: -f1); do
            tail -c +$((off + 1)) "$vmlinuz" | $tool >"$out" 2>/dev/null || true
            if [ "$(head -c 4 "$out" | od -An -c | tr -d ' ')" = '177ELF' ]; then
                return 0
            fi
        done
    done
    rm -f "$out"
    return 1
}

# Makes sure the kernel is in the cache, fetching and unpacking it if needed.
# Holds a lock on the cache meanwhile, so that concurrent runs fetch once.
kernel_ensure() {
    local pkg dir tmp old lock
    pkg=$(kernel_package)
    if [ -z "$pkg" ]; then
        # A machine whose package lists were never fetched (fresh container).
        log "no kernel package known to apt; running apt-get update"
        if [ "$(id -u)" -eq 0 ]; then apt-get update -q >&2; else sudo apt-get update -q >&2; fi
        pkg=$(kernel_package)
    fi
    [ -n "$pkg" ] || die "cannot resolve the kernel package: 'apt-cache depends linux-image-amd64' names none"
    dir=$VM_CACHE/$pkg
    mkdir -p "$VM_CACHE"
    exec {lock}>"$VM_CACHE/.lock"
    flock "$lock"
    rm -rf "$VM_CACHE"/.fetch.* # left by an interrupted fetch
    if [ ! -e "$dir/ok" ]; then
        log "fetching kernel $pkg into $dir"
        rm -rf "$dir"
        tmp=$(mktemp -d "$VM_CACHE/.fetch.XXXXXX")
        # apt-get download writes into the current directory; as root it warns that
        # the _apt user cannot write there, which is harmless.
        (cd "$tmp" && apt-get download -q "$pkg" 2>&1) | { grep -v unsandboxed || true; } >&2
        ls "$tmp"/"$pkg"_*.deb >/dev/null 2>&1 || die "apt-get download $pkg failed"
        dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/root"
        mkdir -p "$tmp/out"
        kernel_extract_vmlinux "$tmp"/root/boot/vmlinuz-* "$tmp/out/vmlinux" ||
            die "no ELF kernel found inside $(echo "$tmp"/root/boot/vmlinuz-*)"
        cp "$tmp"/root/boot/config-* "$tmp/out/"
        mkdir -p "$tmp/out/lib"
        mv "$tmp/root/lib/modules" "$tmp/out/lib/modules"
        rm -rf "$tmp/root" "$tmp"/*.deb
        mv "$tmp/out" "$dir"
        rmdir "$tmp"
        touch "$dir/ok"
        # Debian moved to a newer kernel: the older cache entries are dead weight.
        for old in "$VM_CACHE"/linux-image-*; do
            [ "$old" = "$dir" ] || { log "removing the older cached kernel $old"; rm -rf "$old"; }
        done
    fi
    exec {lock}>&-
    KERNEL_VMLINUX=$dir/vmlinux
    KERNEL_VERSION=$(basename "$(echo "$dir"/lib/modules/*)")
    KERNEL_MODULES=$dir/lib/modules/$KERNEL_VERSION
    grep -q '^CONFIG_TLS=[ym]' "$dir"/config-* ||
        die "kernel $pkg has no CONFIG_TLS; the kTLS scenarios need it"
}

# Prints the path of the module named $1 (dashes and underscores are the same
# thing in module names) inside the cached tree, or fails.
kernel_module_path() {
    local name=${1//-/_} path
    path=$(find "$KERNEL_MODULES/kernel" \( -name "$name.ko" -o -name "${name//_/-}.ko" \) -print -quit)
    [ -n "$path" ] || return 1
    echo "$path"
}

# Copies the modules named in $2... and everything they depend on (modinfo's
# `depends=` field, followed recursively) into the staging root $1, with the same
# paths as on a real system, then runs depmod there so that the guest's modprobe
# resolves dependencies and the kernel's module autoloading works as on a stock
# Debian machine. Built-in drivers (modules.builtin) need no file.
kernel_install_modules() {
    local root=$1 todo seen name path deps
    shift
    todo=("$@")
    seen=" "
    while [ ${#todo[@]} -gt 0 ]; do
        name=${todo[0]//-/_}
        todo=("${todo[@]:1}")
        case $seen in *" $name "*) continue ;; esac
        seen="$seen$name "
        if grep -q "/${name}.ko\$\|/${name//_/-}.ko\$" "$KERNEL_MODULES/modules.builtin"; then
            continue
        fi
        path=$(kernel_module_path "$name") || die "kernel module $name not found in $KERNEL_MODULES"
        mkdir -p "$root/lib/modules/$KERNEL_VERSION/$(dirname "${path#"$KERNEL_MODULES"/}")"
        cp "$path" "$root/lib/modules/$KERNEL_VERSION/${path#"$KERNEL_MODULES"/}"
        deps=$(modinfo -F depends "$path")
        [ -n "$deps" ] && todo+=(${deps//,/ })
    done
    cp "$KERNEL_MODULES"/modules.builtin* "$KERNEL_MODULES"/modules.order "$root/lib/modules/$KERNEL_VERSION/"
    depmod -b "$root" "$KERNEL_VERSION"
}
