// The kernel's counters of UDP drops, read from /proc/net: the drops of the sockets bound to a port (/proc/net/udp and udp6), and
// the receive-buffer overflows and deliveries of all sockets (/proc/net/snmp
// and snmp6). The benchmark and the integration tests read them alike, so
// that "socket drops" means one thing in both.

package backlog

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// The files this package reads.
const (
	udpFile   = "/proc/net/udp"
	udp6File  = "/proc/net/udp6"
	snmpFile  = "/proc/net/snmp"
	snmp6File = "/proc/net/snmp6"
)

// socketLineFields is the least number of fields of a socket's line in
// /proc/net/udp: the drops are the last.
const socketLineFields = 13

// SocketDrops sums the drops of the UDP sockets bound to port, IPv4 and
// IPv6: datagrams a socket filter refused, and those a full receive queue
// lost.
func SocketDrops(port int) (uint64, error) { return sumSockets(port, "drops", ParseSocketDrops) }

// ParseSocketDrops sums the drops column of the sockets whose local port is
// port in r, a table in the format of /proc/net/udp or udp6.
func ParseSocketDrops(r io.Reader, port int) (uint64, error) {
	return parseSockets(r, port, func(f []string) (uint64, error) {
		n, err := strconv.ParseUint(f[len(f)-1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("drops column %q: %w", f[len(f)-1], err)
		}
		return n, nil
	})
}

// SocketQueued sums the bytes queued for reading on the UDP sockets bound
// to port, IPv4 and IPv6 (the rx_queue column).
func SocketQueued(port int) (uint64, error) { return sumSockets(port, "queues", ParseSocketQueued) }

// ParseSocketQueued sums the rx_queue column (hexadecimal, after the colon
// of tx_queue:rx_queue) of the sockets whose local port is port in r.
func ParseSocketQueued(r io.Reader, port int) (uint64, error) {
	return parseSockets(r, port, func(f []string) (uint64, error) {
		_, rx, ok := strings.Cut(f[4], ":")
		if !ok {
			return 0, fmt.Errorf("queue column %q: want tx:rx", f[4])
		}
		n, err := strconv.ParseUint(rx, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("queue column %q: %w", f[4], err)
		}
		return n, nil
	})
}

// sumSockets sums what parse reads of the sockets bound to port in
// /proc/net/udp and udp6; what names it in errors.
func sumSockets(port int, what string, parse func(io.Reader, int) (uint64, error)) (uint64, error) {
	var total uint64
	for _, file := range []string{udpFile, udp6File} {
		f, err := os.Open(file)
		if err != nil {
			return 0, fmt.Errorf("reading socket %s: %w", what, err)
		}
		n, err := parse(f, port)
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", file, err)
		}
		total += n
	}
	return total, nil
}

// parseSockets sums column over the lines of the sockets whose local port
// is port in r, a table in the format of /proc/net/udp or udp6.
func parseSockets(r io.Reader, port int, column func(fields []string) (uint64, error)) (uint64, error) {
	if port <= 0 || port > 0xffff {
		return 0, fmt.Errorf("port %d is not a UDP port", port)
	}
	var total uint64
	suffix := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < socketLineFields || f[0] == "sl" || !strings.HasSuffix(f[1], suffix) {
			continue
		}
		n, err := column(f)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, sc.Err()
}

// UDPCounters are the kernel's UDP counters, summed over every socket.
type UDPCounters struct {
	// InDatagrams counts IPv4 datagrams delivered to sockets (a socket
	// filter's passes included); InDatagrams6 IPv6 ones.
	InDatagrams, InDatagrams6 uint64
	// RcvbufErrors counts IPv4 datagrams dropped because a socket's
	// receive queue was full; RcvbufErrors6 IPv6 ones.
	RcvbufErrors, RcvbufErrors6 uint64
}

// ReadUDPCounters reads the UDP counters of /proc/net/snmp and snmp6.
func ReadUDPCounters() (UDPCounters, error) {
	snmp, err := os.ReadFile(snmpFile)
	if err != nil {
		return UDPCounters{}, fmt.Errorf("reading UDP counters: %w", err)
	}
	snmp6, err := os.ReadFile(snmp6File)
	if err != nil {
		return UDPCounters{}, fmt.Errorf("reading UDP counters: %w", err)
	}
	c, err := ParseUDPCounters(string(snmp), string(snmp6))
	if err != nil {
		return UDPCounters{}, fmt.Errorf("reading %s and %s: %w", snmpFile, snmp6File, err)
	}
	return c, nil
}

// ParseUDPCounters reads the UDP counters from the text of /proc/net/snmp
// (a line of names after "Udp:", then one of values) and of
// /proc/net/snmp6 (a name and a value per line).
func ParseUDPCounters(snmp, snmp6 string) (UDPCounters, error) {
	var c UDPCounters
	v4, err := snmpTable(snmp, "Udp:")
	if err != nil {
		return c, err
	}
	v6 := map[string]uint64{}
	for line := range strings.SplitSeq(snmp6, "\n") {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[0], "Udp6") {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return c, fmt.Errorf("%s %q: %w", f[0], f[1], err)
			}
			v6[f[0]] = n
		}
	}
	for _, want := range []struct {
		into  *uint64
		table map[string]uint64
		name  string
	}{
		{&c.InDatagrams, v4, "InDatagrams"},
		{&c.RcvbufErrors, v4, "RcvbufErrors"},
		{&c.InDatagrams6, v6, "Udp6InDatagrams"},
		{&c.RcvbufErrors6, v6, "Udp6RcvbufErrors"},
	} {
		n, ok := want.table[want.name]
		if !ok {
			return c, fmt.Errorf("no UDP counter %s", want.name)
		}
		*want.into = n
	}
	return c, nil
}

// snmpTable reads the counters of the table whose lines start with prefix:
// a line of names, then one of values.
func snmpTable(text, prefix string) (map[string]uint64, error) {
	lines := strings.Split(text, "\n")
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], prefix) || !strings.HasPrefix(lines[i+1], prefix) {
			continue
		}
		names, vals := strings.Fields(lines[i])[1:], strings.Fields(lines[i+1])[1:]
		if len(names) != len(vals) {
			return nil, fmt.Errorf("%s %d names but %d values", prefix, len(names), len(vals))
		}
		out := make(map[string]uint64, len(names))
		for j, name := range names {
			n, err := strconv.ParseUint(vals[j], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s %s %q: %w", prefix, name, vals[j], err)
			}
			out[name] = n
		}
		return out, nil
	}
	return nil, fmt.Errorf("no %s table", prefix)
}

// Drops is a reading of the counters that say why datagrams to one UDP
// port were dropped.
type Drops struct {
	// Socket counts the drops of the sockets on the port: by their filter,
	// or because their receive queue was full.
	Socket uint64
	// Overflow counts the datagrams the kernel dropped because a socket's
	// receive queue was full, every socket (RcvbufErrors, IPv4 and IPv6).
	Overflow uint64
}

// ReadDrops reads the drop counters of the UDP sockets on port.
func ReadDrops(port int) (Drops, error) {
	s, err := SocketDrops(port)
	if err != nil {
		return Drops{}, err
	}
	c, err := ReadUDPCounters()
	if err != nil {
		return Drops{}, err
	}
	return Drops{Socket: s, Overflow: c.RcvbufErrors + c.RcvbufErrors6}, nil
}

// FilteredSince returns how many datagrams the sockets' filter dropped since
// d0: the sockets' drops less the queue overflows, which a slow reader (the
// race detector, a busy machine) causes whatever the filter does.
func (d Drops) FilteredSince(d0 Drops) uint64 {
	n, over := d.Socket-d0.Socket, d.Overflow-d0.Overflow
	if over > n {
		return 0
	}
	return n - over
}
