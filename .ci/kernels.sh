#!/usr/bin/env bash
# Runs the BPF program's tests (internal/kernel) under the Linux kernels that
# users run, each booted in QEMU (KVM, or its emulator where KVM cannot boot
# them): Debian's kernel packages, taken from the archive with apt (whatever
# point release it serves in each series). It prints, for each kernel, its
# version, the result, the instructions the verifier processed and the time,
# and exits non-zero when a kernel fails.
#
# Run as root (apt, QEMU), from make: `make test-kernels`. It lives in
# .ci/ beside .ci/run because it is machinery of the same kind (it installs
# packages, boots machines, needs root), not an input of a Go test.
#
# Each entry of KERNELS is a kernel series ("6.1": the newest 6.1 package
# the archive serves), or "newest" (the newest kernel of all the suites
# below). An entry ending in ":refuses" is a kernel under the floor: it must
# refuse the program (a verifier error from TestVerifierBudget), and it fails
# the run if it loads it, so that the floor in the README is lowered then.
#
#   KERNELS        the kernels (default: "5.10:refuses 6.1 6.12 newest")
#   KERNEL_TESTS   the -test.run pattern of the tests to run (default: all,
#                  4 to 5 minutes a kernel under TCG), or "quick": loading,
#                  the differential tests of connection ID verification and
#                  of the parser's edges, the classes, and the socket
#                  tests that attach the filter (about a minute a kernel)
#   KERNELS_CACHE  where the package lists and kernels are kept between runs
#                  (default: /var/cache/rakelimit-kernels)
#   KERNELS_OUT    where each kernel's console log is written
#                  (default: a new directory under /tmp)
#   KERNELS_REFRESH=1  updates the package lists even when less than a day old
#   KERNELS_ACCEL  kvm or tcg (default: kvm where the host has kvm_intel or
#                  kvm_amd, else tcg)
#   KERNEL_TEST_BIN  a test binary built already (go test -c, CGO_ENABLED=0)
#
# The machines have no network device at all (-nic none): the tests send
# only over the guest's own loopback, and within network namespaces they
# make inside it. Each machine gets 2 CPUs (a test floods from two) and 1 GiB.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"

KERNELS=${KERNELS:-"5.10:refuses 6.1 6.12 newest"}
KERNEL_TESTS=${KERNEL_TESTS:-.}
if [ "$KERNEL_TESTS" = quick ]; then
	KERNEL_TESTS='^(TestVerifierBudget|TestDifferentialVerify|TestDifferentialLengths|TestDifferentialVarintsAcrossProbe'
	KERNEL_TESTS+='|TestClassifyFrames|TestClassifyFramesVerify|TestTotalPerCPU|TestSweepConcurrent|TestStreamEvents'
	KERNEL_TESTS+='|TestLearnExpire|TestInfo|TestSocketProbes|TestSocketClasses|TestSocketGSOBatches|TestLoadWithoutCapBPF)$'
fi
CACHE=${KERNELS_CACHE:-/var/cache/rakelimit-kernels}
OUT=${KERNELS_OUT:-$(mktemp -d /tmp/rakelimit-kernels.XXXXXX)}
VM_TIMEOUT=${VM_TIMEOUT:-1200}
mkdir -p "$CACHE" "$OUT"

# The host's tools: QEMU, a static busybox for the guest's init, and what
# the tests call (iproute2's ip for network namespaces, util-linux's
# setpriv), which are copied into the guest with their libraries.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
command -v ip >/dev/null || need+=(iproute2)
command -v setpriv >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
	echo "installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# KVM where the host has hardware virtualization (kvm_intel, kvm_amd);
# QEMU's emulator (TCG) elsewhere, several times slower. A /dev/kvm alone is
# not enough: a host that is itself a virtual machine may serve it from a
# paravirtual module (such as kvm_pvm) that boots only kernels built for it,
# on which Debian's kernels hang in their decompressor.
ACCEL=${KERNELS_ACCEL:-}
if [ -z "$ACCEL" ]; then
	ACCEL=tcg
	if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
		ACCEL=kvm
	fi
fi
case $ACCEL in
kvm) ACCEL_ARGS=(-accel kvm -cpu host) ;;
tcg) ACCEL_ARGS=(-accel "tcg,thread=${KERNELS_TCG_THREAD:-single}" -cpu max) ;;
*)
	echo "KERNELS_ACCEL=$ACCEL: want kvm or tcg" >&2
	exit 1
	;;
esac
echo "booting with $ACCEL"

# A private apt state, so that the host's sources stay as they are: the
# suites whose kernels users run (Debian 11, 12 and its backports, 13 and
# its backports, unstable). Only the package lists, no DEP-11 metadata.
APTDIR=$CACHE/apt
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
key=/usr/share/keyrings/debian-archive-keyring.gpg
{
	for suite in bullseye bookworm bookworm-updates bookworm-backports trixie trixie-backports sid; do
		echo "deb [signed-by=$key] http://deb.debian.org/debian $suite main"
	done
	echo "deb [signed-by=$key] http://deb.debian.org/debian-security bookworm-security main"
} >"$APTDIR/sources.list"
APT=(-o "Dir::Etc::SourceList=$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$APTDIR/lists" -o "Dir::Cache=$APTDIR/cache" -o Dir::State::Status=/dev/null
	-o Acquire::Languages=none -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
	-o APT::Sandbox::User=root)
stamp=$APTDIR/updated
if [ "${KERNELS_REFRESH:-0}" = 1 ] || [ -z "$(find "$stamp" -mmin -1440 2>/dev/null)" ]; then
	echo "updating the kernel package lists"
	# bullseye-backports is gone from the archive; the suites that are
	# there must all answer.
	apt-get "${APT[@]}" update -qq
	touch "$stamp"
fi

# resolve prints the kernel package of a series (or of "newest"): the
# signed image for amd64 of the highest version the lists hold.
resolve() {
	local all
	all=$(apt-cache "${APT[@]}" search --names-only '^linux-image-[0-9]' |
		awk '{print $1}' |
		grep -E '^linux-image-[0-9]+\.[0-9]+\.[0-9]+(-[0-9]+)?(\+deb[0-9.]+)?-amd64$' | sort -V)
	if [ "$1" = newest ]; then
		tail -1 <<<"$all"
	else
		grep -F "linux-image-$1." <<<"$all" | tail -1
	fi
}

# kernel prints the path of the vmlinuz of package $1, downloading and
# unpacking it the first time. The image package holds it in /boot up to
# 6.x; from 7.x on it only depends on the package that holds it,
# linux-binary-<version>, in /usr/lib/modules/<version>/.
kernel() {
	local dir=$CACHE/kernels/$1 holder=$1 binary=linux-binary-${1#linux-image-} image
	if [ ! -s "$dir/vmlinuz" ]; then
		rm -rf "$dir" && mkdir -p "$dir/deb" || return 1
		if apt-cache "${APT[@]}" show "$binary" >/dev/null 2>&1; then
			holder=$binary
		fi
		(cd "$dir/deb" && apt-get "${APT[@]}" download -qq "$holder" >&2) || return 1
		dpkg-deb --fsys-tarfile "$dir"/deb/*.deb |
			tar -x -C "$dir/deb" --wildcards --no-anchored 'vmlinuz*' || return 1
		image=$(find "$dir/deb" -type f -name 'vmlinuz*' | head -1)
		[ -n "$image" ] && mv "$image" "$dir/vmlinuz" || return 1
		rm -rf "$dir/deb"
	fi
	echo "$dir/vmlinuz"
}

# The guest: busybox, the test binary (static) with the package's testdata,
# ip and setpriv with their libraries, and an init that mounts what the
# tests need, runs them with CI=true (a skip fails) and prints a marker
# line with their exit status before it powers the machine off.
WORK=$(mktemp -d /tmp/rakelimit-kernels-work.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if [ -n "${KERNEL_TEST_BIN:-}" ]; then
	cp "$KERNEL_TEST_BIN" "$WORK/kernel.test"
else
	echo "building the internal/kernel test binary"
	CGO_ENABLED=0 go test -c -o "$WORK/kernel.test" ./internal/kernel
fi

# initramfs ROOT TESTS builds the guest's root in ROOT, to run the tests
# that match TESTS, and prints the path of its image.
initramfs() {
	local root=$1 tests=$2 bin lib
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,var,etc,pkg}
	ln -s ../run "$root/var/run"
	cp /bin/busybox "$root/bin/busybox"
	for bin in "$(command -v ip)" "$(command -v setpriv)"; do
		cp -L "$bin" "$root/usr/bin/"
		for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
			cp -L --parents "$lib" "$root"
		done
	done
	echo 'root:x:0:0:root:/:/bin/sh' >"$root/etc/passwd"
	echo 'nobody:x:65534:65534:nobody:/:/bin/false' >>"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
	cp "$WORK/kernel.test" "$root/pkg/"
	cp -r internal/kernel/testdata "$root/pkg/"
	cat >"$root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/bin:/usr/sbin:/bin:/sbin HOME=/ TMPDIR=/tmp CI=true
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t bpf bpf /sys/fs/bpf
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
# Before Linux 5.11 BPF memory counts against RLIMIT_MEMLOCK, whose default
# refuses the maps before the verifier sees the program: lift it, so that a
# kernel under the floor says what it lacks.
ulimit -l unlimited
# The tests' receivers ask for 8 MiB buffers (testutil.ReadBuffer), which
# the default net.core.rmem_max (208 KiB) caps: under emulation the reader
# falls behind a flood and the socket drops what the filter passed.
echo 8388608 >/proc/sys/net/core/rmem_max
echo 8388608 >/proc/sys/net/core/wmem_max
# The filter takes about 34 KB of a socket's option memory: Linux 6.1's
# default net.core.optmem_max (20 KB) refuses to attach it, as the README
# says; raise it as the README tells users to.
if [ "\$(cat /proc/sys/net/core/optmem_max)" -lt 131072 ]; then
	echo "net.core.optmem_max was \$(cat /proc/sys/net/core/optmem_max): raised to 262144"
	echo 262144 >/proc/sys/net/core/optmem_max
fi
ip link set lo up
echo "RAKELIMIT-VM-KERNEL \$(uname -r) cpus=\$(nproc)"
cd /pkg
./kernel.test -test.v -test.count=1 -test.timeout=15m -test.run '$tests'
echo "RAKELIMIT-VM-RESULT rc=\$?"
poweroff -f
EOF
	chmod +x "$root/init"
	(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$root.cpio.gz"
	echo "$root.cpio.gz"
}
all_image=$(initramfs "$WORK/all" "$KERNEL_TESTS")
floor_image=$(initramfs "$WORK/floor" '^TestVerifierBudget$')

# boot KERNEL IMAGE LOG boots a machine and writes its console to LOG.
boot() {
	timeout "$VM_TIMEOUT" qemu-system-x86_64 "${ACCEL_ARGS[@]}" -smp 2 -m 1G \
		-nodefaults -nic none -display none -no-reboot -serial stdio \
		-kernel "$1" -initrd "$2" \
		-append 'console=ttyS0 quiet panic=-1 rdinit=/init' </dev/null >"$3" 2>&1 || true
}

failed=0
results=()
for entry in $KERNELS; do
	series=${entry%%:*}
	refuses=
	[ "$entry" != "$series" ] && refuses=1
	pkg=$(resolve "$series")
	if [ -z "$pkg" ]; then
		echo "no kernel package of series $series in the archive" >&2
		results+=("$(printf '%-34s %-24s %-10s %s' "$series" - "missing" -)")
		failed=1
		continue
	fi
	if ! vmlinuz=$(kernel "$pkg"); then
		echo "cannot unpack the kernel of $pkg" >&2
		results+=("$(printf '%-34s %-24s %-10s %s' "$pkg" - "missing" -)")
		failed=1
		continue
	fi
	image=$all_image
	[ -n "$refuses" ] && image=$floor_image
	log=$OUT/${pkg#linux-image-}.log
	echo "--- booting $pkg"
	start=$(date +%s)
	boot "$vmlinuz" "$image" "$log"
	secs=$(($(date +%s) - start))
	version=$(sed -n 's/.*RAKELIMIT-VM-KERNEL \([^ ]*\).*/\1/p' "$log" | head -1)
	rc=$(sed -n 's/.*RAKELIMIT-VM-RESULT rc=\([0-9]*\).*/\1/p' "$log" | head -1)
	insns=$(sed -n 's/.*verifier processed \([0-9]*\) instructions.*/\1/p' "$log" | head -1)
	if [ -z "$rc" ]; then
		result="no-result"
	elif [ -n "$refuses" ]; then
		# Refused: a load error, not a missing privilege.
		if [ "$rc" != 0 ] && grep 'loading the rakelimit BPF socket filter' "$log" | grep -qv 'operation not permitted'; then
			result="refuses"
		else
			result="LOADS"
		fi
	elif [ "$rc" = 0 ]; then
		result="pass"
	else
		result="FAIL"
	fi
	case $result in
	pass | refuses) ;;
	*)
		failed=1
		echo "$pkg: $result; the failing tests (the whole console: $log):"
		grep -E -e '--- FAIL|load: |RAKELIMIT-VM|Kernel panic' "$log" | cut -c1-400 | tail -40 || true
		if [ "$result" = LOADS ]; then
			echo "$pkg loads the program: the floor in the README may go down"
		fi
		;;
	esac
	if [ "$result" = refuses ]; then
		echo "$pkg refuses the program, as expected under the floor:"
		grep -m1 -o 'loading the rakelimit BPF socket filter.*' "$log" | cut -c1-400 || true
	fi
	results+=("$(printf '%-34s %-24s %-10s %-12s %ss' "$pkg" "${version:--}" "$result" "${insns:--}" "$secs")")
done

echo "--- kernels (console logs in $OUT)"
printf '%-34s %-24s %-10s %-12s %s\n' package "uname -r" result "verifier" time
printf '%s\n' "${results[@]}"
exit $failed
