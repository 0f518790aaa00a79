//go:build linux

package virtiobench

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolChannels is struct ethtool_channels.
type ethtoolChannels struct {
	cmd                                         uint32
	maxRx, maxTx, maxOther, maxCombined         uint32
	rxCount, txCount, otherCount, combinedCount uint32
}

// channels does an ETHTOOL_GCHANNELS or ETHTOOL_SCHANNELS request on the
// interface name.
func channels(name string, ch *ethtoolChannels) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// struct ifreq pointing at ch; both on the heap, where nothing moves
	// them.
	ifr := &struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}{data: uintptr(unsafe.Pointer(ch))}
	copy(ifr.name[:], name)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(ifr)))
	runtime.KeepAlive(ch)
	if errno != 0 {
		return errno
	}
	return nil
}

// queuePairs returns the combined channels (virtio-net's queue pairs) of
// the interface name in use and at most.
func queuePairs(name string) (current, most int, err error) {
	ch := &ethtoolChannels{cmd: unix.ETHTOOL_GCHANNELS}
	if err := channels(name, ch); err != nil {
		return 0, 0, fmt.Errorf("reading the channels of %s: %w", name, err)
	}
	return int(ch.combinedCount), int(ch.maxCombined), nil
}

// setQueuePairs sets the combined channels of the interface name in use
// (`ethtool -L NAME combined n`); virtio-net refuses while an XDP program
// runs on it.
func setQueuePairs(name string, n int) error {
	ch := &ethtoolChannels{cmd: unix.ETHTOOL_GCHANNELS}
	if err := channels(name, ch); err != nil {
		return fmt.Errorf("reading the channels of %s: %w", name, err)
	}
	if int(ch.combinedCount) == n {
		return nil
	}
	ch.cmd, ch.combinedCount = unix.ETHTOOL_SCHANNELS, uint32(n)
	if err := channels(name, ch); err != nil {
		return fmt.Errorf("setting %d combined channels on %s (at most %d): %w", n, name, ch.maxCombined, err)
	}
	return nil
}
