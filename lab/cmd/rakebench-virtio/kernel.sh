#!/usr/bin/env bash
# Prints the directory of a Debian kernel for rakebench-virtio's guest:
# DIR/vmlinuz and DIR/modules/*.ko, the modules of virtio's PCI transport
# and of virtio-net (Debian builds them as modules). It keeps them where
# .ci/kernels.sh keeps its kernels, and reads the archive through the
# private apt state that script keeps there (the host's sources stay as
# they are): DIR is $KERNELS_CACHE/kernels/<package>, beside the vmlinuz
# that script unpacks.
#
#   kernel.sh [SERIES]   SERIES: "6.1" (default; the newest 6.1 package the
#                        archive serves) or "newest"
#
# Run as root (apt). It installs what the benchmark needs on the host when
# it is missing: QEMU, a static busybox (the guest's init), iproute2.
#
#   KERNELS_CACHE    the cache (default: /var/cache/rakelimit-kernels)
#   KERNELS_REFRESH=1  updates the package lists even when less than a day old
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
SERIES=${1:-6.1}
CACHE=${KERNELS_CACHE:-/var/cache/rakelimit-kernels}

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
	echo "installing ${need[*]}" >&2
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# The same private apt state as .ci/kernels.sh (its suites, its lists).
APTDIR=$CACHE/apt
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
key=/usr/share/keyrings/debian-archive-keyring.gpg
if [ ! -s "$APTDIR/sources.list" ]; then
	{
		for suite in bullseye bookworm bookworm-updates bookworm-backports trixie trixie-backports sid; do
			echo "deb [signed-by=$key] http://deb.debian.org/debian $suite main"
		done
		echo "deb [signed-by=$key] http://deb.debian.org/debian-security bookworm-security main"
	} >"$APTDIR/sources.list"
fi
APT=(-o "Dir::Etc::SourceList=$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
	-o "Dir::State::Lists=$APTDIR/lists" -o "Dir::Cache=$APTDIR/cache" -o Dir::State::Status=/dev/null
	-o Acquire::Languages=none -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
	-o APT::Sandbox::User=root)
stamp=$APTDIR/updated
if [ "${KERNELS_REFRESH:-0}" = 1 ] || [ -z "$(find "$stamp" -mmin -1440 2>/dev/null)" ]; then
	echo "updating the kernel package lists" >&2
	apt-get "${APT[@]}" update -qq >&2
	touch "$stamp"
fi

# The signed image for amd64 of the highest version of the series.
all=$(apt-cache "${APT[@]}" search --names-only '^linux-image-[0-9]' | awk '{print $1}' |
	grep -E '^linux-image-[0-9]+\.[0-9]+\.[0-9]+(-[0-9]+)?(\+deb[0-9.]+)?-amd64$' | sort -V)
if [ "$SERIES" = newest ]; then
	pkg=$(tail -1 <<<"$all")
else
	pkg=$(grep -F "linux-image-$SERIES." <<<"$all" | tail -1 || true)
fi
if [ -z "$pkg" ]; then
	echo "no kernel package of series $SERIES in the archive" >&2
	exit 1
fi

dir=$CACHE/kernels/$pkg
if [ ! -s "$dir/vmlinuz" ] || [ ! -d "$dir/modules" ]; then
	echo "unpacking $pkg" >&2
	deb=$(mktemp -d /tmp/rakebench-virtio-kernel.XXXXXX)
	trap 'rm -rf "$deb"' EXIT
	# From 7.x on the image package only depends on the one that holds
	# the kernel and its modules, linux-binary-<version>.
	holder=$pkg binary=linux-binary-${pkg#linux-image-}
	if apt-cache "${APT[@]}" show "$binary" >/dev/null 2>&1; then
		holder=$binary
	fi
	(cd "$deb" && apt-get "${APT[@]}" download -qq "$holder" >&2)
	dpkg-deb --fsys-tarfile "$deb"/*.deb | tar -x -C "$deb" --wildcards --no-anchored \
		'vmlinuz*' '*/drivers/virtio/virtio.ko*' '*/drivers/virtio/virtio_ring.ko*' '*/drivers/virtio/virtio_pci*' '*/drivers/net/virtio_net.ko*' '*/drivers/net/net_failover.ko*' '*/net/core/failover.ko*'
	mkdir -p "$dir/modules.new"
	for ko in $(find "$deb" -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst'); do
		case $ko in
		*.xz) xz -dc "$ko" >"$dir/modules.new/$(basename "${ko%.xz}")" ;;
		*.zst) zstd -qdc "$ko" >"$dir/modules.new/$(basename "${ko%.zst}")" ;;
		*) cp "$ko" "$dir/modules.new/" ;;
		esac
	done
	if [ ! -s "$dir/vmlinuz" ]; then
		image=$(find "$deb" -type f -name 'vmlinuz*' | head -1)
		[ -n "$image" ] && mv "$image" "$dir/vmlinuz"
	fi
	rm -rf "$dir/modules" && mv "$dir/modules.new" "$dir/modules"
fi
echo "$dir"
