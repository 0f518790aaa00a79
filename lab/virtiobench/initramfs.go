//go:build linux

package virtiobench

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/lab/xdpbench"
)

// guestModules are the modules the guest loads: Debian builds virtio's
// PCI transport and virtio-net as modules. kernel.sh copies those the
// kernel package has.
const guestModules = "virtio virtio_ring virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover net_failover virtio_net"

// Where the guest's root holds the agent and Caddy.
const (
	agentPath = "/rakebench-virtio"
	caddyPath = "/caddy"
)

// initScript is the guest's init: it mounts what Caddy and its BPF
// programs need, loads the NIC's modules (in passes, until no more load:
// each after those it needs), raises the limits the README asks for (the
// filter's option memory, Caddy's buffers), puts the guest's address on
// the NIC with the route and neighbour of the namespace's side, runs the
// agent until the host asks it to power off, and powers off. It calls
// iproute2's ip by its path: busybox's shell prefers its own applets.
func initScript() string {
	return fmt.Sprintf(`#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/bin:/usr/sbin:/bin:/sbin HOME=/ TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t bpf bpf /sys/fs/bpf
left="%[1]s"
for pass in 1 2 3 4 5; do
	next=
	for m in $left; do
		[ -f /lib/modules/$m.ko ] || continue
		insmod /lib/modules/$m.ko 2>/dev/null || next="$next $m"
	done
	left=$next
done
[ -n "$left" ] && echo "RAKEBENCH-VIRTIO-MODULES not loaded:$left"
echo 8388608 >/proc/sys/net/core/rmem_max
echo 8388608 >/proc/sys/net/core/wmem_max
echo 262144 >/proc/sys/net/core/optmem_max
IP=/usr/bin/ip
$IP link set lo up
i=0
while [ ! -e /sys/class/net/%[2]s ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
$IP link set %[2]s up
$IP addr add %[3]s/64 dev %[2]s nodad
$IP -6 route add %[4]s dev %[2]s
$IP -6 neigh replace %[5]s lladdr %[6]s dev %[2]s nud permanent
echo "RAKEBENCH-VIRTIO-GUEST $(uname -r) cpus=$(nproc)"
%[7]s guest -listen '%[8]s' -caddy %[9]s -iface %[2]s -dir /tmp/caddy
echo "RAKEBENCH-VIRTIO-EXIT rc=$?"
poweroff -f
`, guestModules, guestIf, guestAddr, xdpbench.FloodPrefix, hostAddr, hostMAC, agentPath, agentAddr(), caddyPath)
}

// staticELF returns an error unless path is a statically linked
// executable: the guest has no C library.
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is linked dynamically: build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

// lddPaths are the libraries of ldd's output, by path.
func lddPaths(out string) []string {
	var paths []string
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, "/") {
			paths = append(paths, f)
		}
	}
	return paths
}

// buildInitramfs writes the guest's root into dir/root and archives it as
// dir/root.cpio (newc, uncompressed: the emulator would spend longer
// decompressing it than QEMU copying it), whose path it returns: busybox
// (static, the host's) for init's commands, iproute2's ip with its
// libraries (busybox's shows no XDP), the kernel's modules from
// kernelDir/modules, Caddy and this command (both static), and the init.
func buildInitramfs(dir, caddy, kernelDir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return "", fmt.Errorf("the guest's init needs busybox (apt-get install busybox-static): %w", err)
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return "", fmt.Errorf("the guest needs iproute2's ip: %w", err)
	}
	for _, bin := range []string{busybox, caddy, self} {
		if err := staticELF(bin); err != nil {
			return "", err
		}
	}
	modules, err := filepath.Glob(filepath.Join(kernelDir, "modules", "*.ko"))
	if err != nil || len(modules) == 0 {
		return "", fmt.Errorf("no modules in %s/modules: run kernel.sh (the guest's NIC needs virtio_net)", kernelDir)
	}
	root := filepath.Join(dir, "root")
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "run", "etc", "lib/modules"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	copies := map[string]string{busybox: "bin/busybox", ip: "usr/bin/ip", caddy: strings.TrimPrefix(caddyPath, "/"),
		self: strings.TrimPrefix(agentPath, "/")}
	for _, m := range modules {
		copies[m] = filepath.Join("lib/modules", filepath.Base(m))
	}
	out, err := exec.Command("ldd", ip).Output()
	if err != nil {
		return "", fmt.Errorf("ldd %s: %w", ip, err)
	}
	for _, lib := range lddPaths(string(out)) {
		copies[lib] = strings.TrimPrefix(lib, "/")
	}
	for from, to := range copies {
		if err := copyFile(from, filepath.Join(root, to)); err != nil {
			return "", err
		}
	}
	files := map[string]string{
		"init":       initScript(),
		"etc/passwd": "root:x:0:0:root:/:/bin/sh\n",
		"etc/group":  "root:x:0:\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o755); err != nil {
			return "", err
		}
	}
	archive := filepath.Join(dir, "root.cpio")
	f, err := os.Create(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var stderr strings.Builder
	cmd := exec.Command("sh", "-c", `find . | "$0" cpio -o -H newc`, busybox)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, f, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("archiving the guest's root: %w: %s", err, stderr.String())
	}
	return archive, f.Close()
}

// copyFile copies from (following links) to to, with from's mode.
func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	st, err := os.Stat(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, b, st.Mode().Perm())
}
