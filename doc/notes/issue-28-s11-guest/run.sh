#!/bin/bash
# How session 11 ran the kernel-TLS tests in qemu guests (issue 28), for whoever wires them
# into kmod/vm: not part of make test, kept as a record. Usage, from the repository root:
#   doc/notes/issue-28-s11-guest/run.sh KERNEL_ROOT ABI LABEL
# KERNEL_ROOT is a directory where the kernel's debs were unpacked with dpkg-deb -x
# (6.1/6.12: linux-image-ABI; 7.3: linux-binary-ABI + linux-modules-ABI).
set -e
R=$1 ABI=$2 L=$3
W=build/ktlsvm
mkdir -p $W/ir/bin $W/ir/sbin $W/ir/proc $W/ir/sys $W/ir/dev $W/ir/tmp
cp /bin/busybox $W/ir/bin/busybox && ln -sf /bin/busybox $W/ir/sbin/modprobe
cp doc/notes/issue-28-s11-guest/init $W/ir/init && chmod +x $W/ir/init
# openssl and the libraries it loads, at the same paths
for f in /usr/bin/openssl $(ldd /usr/bin/openssl | grep -o '/[^ ]*'); do mkdir -p $W/ir$(dirname $f); cp -L $f $W/ir$f; done
mkdir -p $W/ir/usr/lib/ssl && cp -L /usr/lib/ssl/openssl.cnf $W/ir/usr/lib/ssl/
CGO_ENABLED=0 go test -c -o $W/ir/tcpglue.test ./tcpglue
CGO_ENABLED=0 go test -c -o $W/ir/ztls.test ./zc/ztls
rm -rf $W/ir/lib/modules && mkdir -p $W/ir/lib/modules/$ABI/kernel
M=$R/lib/modules/$ABI
[ -d $M ] || M=$R/usr/lib/modules/$ABI
cp -a $M/modules.order $M/modules.builtin $M/modules.builtin.modinfo $W/ir/lib/modules/$ABI/ 2>/dev/null || true
for d in net/tls crypto arch/x86/crypto lib/crypto lib; do
	mkdir -p $W/ir/lib/modules/$ABI/kernel/$d
	cp -a $M/kernel/$d/. $W/ir/lib/modules/$ABI/kernel/$d/ 2>/dev/null || true
done
# busybox loads no compressed module
find $W/ir/lib/modules -name "*.ko.xz" -exec xz -d {} +
[ -f $W/ir/lib/modules/$ABI/modules.order ] && sed -i "s/[.]ko[.]xz$/.ko/" $W/ir/lib/modules/$ABI/modules.order || true
(cd $W/ir && find . | cpio -o -H newc --quiet | gzip -1 > ../initrd-$L.gz)
V=$R/boot/vmlinuz-$ABI
[ -f $V ] || V=$M/vmlinuz
timeout --foreground -k 10 580 qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1536 \
	-nographic -no-reboot -nodefaults -serial stdio -kernel $V -initrd $W/initrd-$L.gz \
	-append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" > $W/console-$L.log 2>&1 || echo "qemu rc=$?"
tr -d '\r' < $W/console-$L.log > $W/console-$L.txt
grep -E '^(--- FAIL|ZCVM: result)' $W/console-$L.txt
grep -nE 'BUG:|WARNING:|Oops|Call Trace' $W/console-$L.txt || true
