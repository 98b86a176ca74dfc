# The guest's root file system: one uncompressed cpio archive built per run and
# shared by every scenario (the kernel unpacks uncompressed cpio fastest under
# TCG), plus a tiny per-boot archive appended to it with /vm/env.
# Sourced by tests/vm/run.

# Host programs the guest gets, each with the shared libraries ldd lists and the
# ELF interpreter, at the same paths as on the host.
GUEST_TOOLS="/usr/bin/curl /usr/sbin/nginx /usr/sbin/ip /usr/sbin/ethtool /usr/bin/iperf3 /usr/bin/wrk /usr/bin/openssl"

# Copies host program $2 into staging root $1 (contents, not the symlink) with its
# libraries.
initramfs_add_program() {
    local root=$1 prog=$2
    mkdir -p "$root$(dirname "$prog")"
    cp -L "$prog" "$root$prog"
    initramfs_add_libraries "$root" "$prog"
}

# Copies the shared libraries and the ELF interpreter program $2 needs (none for a
# static one) into staging root $1, at the host's paths.
initramfs_add_libraries() {
    local root=$1 prog=$2 lib
    for lib in $(ldd "$prog" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
        [ -e "$root$lib" ] && continue
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}

# Writes a CA and a server certificate (ECDSA P-256) for the cables' server
# addresses and localhost into $1: ca.pem, server.pem, server.key.
initramfs_make_certs() {
    local dir=$1 san="DNS:localhost,IP:127.0.0.1" n
    for n in 0 1 2 3; do san="$san,IP:10.$n.0.1"; done
    mkdir -p "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 \
        -keyout "$dir/ca.key" -out "$dir/ca.pem" -subj /CN=linerate-vm-test-ca \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign \
        2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout "$dir/server.key" -out "$dir/server.csr" -subj /CN=localhost 2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
        "$san" >"$dir/server.ext"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
        -CAcreateserial -days 7 -extfile "$dir/server.ext" -out "$dir/server.pem" 2>/dev/null
    rm -f "$dir/server.csr" "$dir/server.ext" "$dir/ca.srl" "$dir/ca.key"
}

# initramfs_build OUT LINERATE_BIN MODULES...: stages everything and writes the cpio
# archive OUT.
initramfs_build() {
    local out=$1 linerate=$2 root applet
    shift 2
    root=$BUILD/root
    rm -rf "$root"
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,root,srv,vm/scenarios}
    mkdir -p "$root"/var/{lib,log}/nginx

    for prog in $GUEST_TOOLS; do initramfs_add_program "$root" "$prog"; done
    # Stripped: the release build's line tables make it five times larger, and every
    # boot copies the archive.
    strip -o "$root/usr/bin/linerate" "$linerate"
    initramfs_add_libraries "$root" "$linerate"
    # Busybox for everything else; an applet link never replaces a real program.
    cp /bin/busybox "$root/bin/busybox"
    for applet in $(/bin/busybox --list-full); do
        [ -e "$root/$applet" ] || [ -L "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"

    kernel_install_modules "$root" "$@"
    initramfs_make_certs "$root/vm/tls"
    cp "$VM_DIR/guest/init" "$root/init"
    cp "$VM_DIR"/guest/*.sh "$root/vm/"
    cp "$VM_DIR"/scenarios/*.sh "$root/vm/scenarios/"
    chmod 755 "$root/init"

    (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$out"
}

# initramfs_boot_image BASE OUT DIR: BASE with a second archive of DIR's contents
# appended (the kernel unpacks concatenated archives in order, so these files are
# added to, or replace, those of BASE): the per-boot /vm/env and media files.
initramfs_boot_image() {
    local base=$1 out=$2 dir=$3
    { cat "$base"; (cd "$dir" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet); } >"$out"
}

# disk_image TITLES MIB: makes (once per run) $BUILD/media/disk-TITLES-MIB.img, an
# ext4 file system holding title1.bin ... titleTITLES.bin of MIB MiB of random bytes
# each, with each title's sha256 in titleN.bin.sha256 (sha_range uses it: reading a
# whole title in the guest would also bring it into the page cache); prints the
# image's path.
disk_image() {
    local image=$BUILD/media/disk-$1-$2.img dir i
    if [ ! -e "$image" ]; then
        dir=$BUILD/media/disk-$1-$2
        mkdir -p "$dir"
        for i in $(seq 1 "$1"); do
            head -c $(($2 * 1048576)) /dev/urandom >"$dir/title$i.bin"
            sha256sum "$dir/title$i.bin" | cut -d' ' -f1 >"$dir/title$i.bin.sha256"
        done
        mkfs.ext4 -q -F -d "$dir" "$image" $(($1 * $2 + 64))M >&2 || die "mkfs.ext4 failed"
    fi
    echo "$image"
}

# initramfs_media MIB: makes (once per run) $BUILD/media/big-MIB.bin, MIB MiB of
# random bytes, and its sha256 next to it; prints the file's path. Random content,
# so that a misplaced byte range cannot match; made on the host because
# /dev/urandom in the guest takes seconds per 64 MiB under TCG.
initramfs_media() {
    local file=$BUILD/media/big-$1.bin
    if [ ! -e "$file.sha256" ]; then
        mkdir -p "$BUILD/media"
        head -c $(($1 * 1048576)) /dev/urandom >"$file"
        sha256sum "$file" | cut -d' ' -f1 >"$file.sha256"
    fi
    echo "$file"
}
