package packetconn

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/quic-go/quic-go"
	"golang.org/x/net/ipv4"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
)

// Conn is the packet conn quic-go reads and writes through, in every mode:
// the listener's *net.UDPConn, embedded, with every read decided by a
// Decider, if one is set (SetDecider: the userspace limiter, in mode
// userspace; none in the modes that decide in the kernel, where every
// datagram passes), and every write shown first to a learn.Learner, if one
// is set (SetLearner), which teaches the engine the server's connection IDs
// and peers.
//
// What quic-go keeps through it: Conn is a quic.OOBCapablePacketConn (the
// embedded socket's SyscallConn, SetReadBuffer, ReadMsgUDP and WriteMsgUDP)
// and has ReadBatch, so quic-go builds its batched reader on it, not a
// basic one: batched reads (8 datagrams per recvmmsg on Linux), ECN marks
// and packet info read from the control messages, which Conn hands over
// unchanged, and every write path, GSO and the don't-fragment bit (so path
// MTU discovery) on the socket itself, once the learner has seen the
// datagram.
//
// What it costs, with a Decider: each datagram is received before it is
// decided, and a kept datagram that follows a dropped one in a batch is
// copied into the slot of the first dropped one (see the package doc).
//
// Every read method decides: ReadBatch, ReadFrom, ReadFromUDP,
// ReadFromUDPAddrPort, ReadMsgUDP, ReadMsgUDPAddrPort and Read. The raw
// connection SyscallConn returns refuses Read, which would bypass the
// Decider; its Control and Write are the socket's. Every write method
// teaches (write.go). Only File, a duplicate of the descriptor, reads and
// writes around them.
type Conn struct {
	*net.UDPConn
	dec     atomic.Pointer[deciderBox]
	learner atomic.Pointer[learn.Learner]
	port    uint16
	// batch reads batches from the socket (recvmmsg; Linux only).
	batch *ipv4.PacketConn
	// scratch holds what a read hands the Decider.
	scratch scratch
}

// scratch holds the datagrams a read hands the Decider, and its verdicts.
// A call through an interface moves the arrays it is given off the stack,
// one allocation per read; these are the Conn's own, for one read at a
// time.
type scratch struct {
	mu   sync.Mutex
	ds   [chunk]decide.Datagram
	drop [chunk]bool
}

// Decider decides the datagrams quic-go reads through a Conn: the
// userspace limiter (userspace.Decider) in mode userspace. Its methods must
// be safe for concurrent use.
type Decider interface {
	// Decide decides one datagram.
	Decide(d *decide.Datagram) decide.Outcome
	// DecideBatch decides every datagram of ds and sets drop[i] for those
	// to drop; drop is at least as long as ds.
	DecideBatch(ds []decide.Datagram, drop []bool)
}

// deciderBox holds a Decider for an atomic pointer.
type deciderBox struct{ d Decider }

// Interface guards: quic-go keeps its fast path only for a conn with all of
// these (quic-go's sys_conn.go, newConn in sys_conn_oob.go), and Caddy and
// this module find the socket under a wrapper through Unwrap.
var (
	_ quic.OOBCapablePacketConn = (*Conn)(nil)
	_ net.Conn                  = (*Conn)(nil)
	_ interface {
		ReadBatch(ms []ipv4.Message, flags int) (int, error)
	} = (*Conn)(nil)
	_ interface{ Unwrap() net.PacketConn } = (*Conn)(nil)
)

// New wraps conn. It has no Decider until SetDecider, so it passes every
// datagram, and no learner until SetLearner.
func New(conn *net.UDPConn) (*Conn, error) {
	if conn == nil {
		return nil, errors.New("wrapping a packet conn: no UDP socket")
	}
	la, ok := conn.LocalAddr().(*net.UDPAddr)
	if !ok || la == nil {
		return nil, fmt.Errorf("wrapping a packet conn: local address %v is not a UDP address",
			conn.LocalAddr())
	}
	return &Conn{UDPConn: conn, port: uint16(la.Port), batch: newBatchReader(conn)}, nil
}

// Unwrap returns the socket, a *net.UDPConn.
func (c *Conn) Unwrap() net.PacketConn { return c.UDPConn }

// Decider returns the Decider in force, or nil.
func (c *Conn) Decider() Decider {
	if b := c.dec.Load(); b != nil {
		return b.d
	}
	return nil
}

// SetDecider puts d in force from the next read on; nil passes every
// datagram, as a socket without a filter does (a wrapper cannot be taken out
// of quic-go's reader once it is there).
func (c *Conn) SetDecider(d Decider) {
	if d == nil {
		c.dec.Store(nil)
		return
	}
	c.dec.Store(&deciderBox{d})
}

// Learner returns the learner in force, or nil.
func (c *Conn) Learner() *learn.Learner { return c.learner.Load() }

// SetLearner puts l in force from the next write on; nil learns nothing.
func (c *Conn) SetLearner(l *learn.Learner) { c.learner.Store(l) }

// errRawRead refuses reads through the raw connection.
var errRawRead = errors.New("rakelimit: reading the raw socket would bypass the userspace limiter; read through the Conn")

// SyscallConn returns the socket's raw connection for Control and Write;
// its Read fails, since it would bypass the Decider.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	rc, err := c.UDPConn.SyscallConn()
	if err != nil {
		return nil, err
	}
	return readlessRawConn{rc}, nil
}

type readlessRawConn struct{ syscall.RawConn }

func (readlessRawConn) Read(func(fd uintptr) bool) error { return errRawRead }

// key is the limiter's key of a datagram from src.
func (c *Conn) key(src netip.AddrPort) sketch.Key {
	if !src.IsValid() {
		return sketch.Key{}
	}
	return sketch.KeyFrom(src, c.port)
}

// keep decides one datagram, payload b from src, with d (nil: keep).
func (c *Conn) keep(d Decider, b []byte, src netip.AddrPort) bool {
	if d == nil {
		return true
	}
	s := &c.scratch
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ds[0] = decide.Datagram{Key: c.key(src), Length: len(b), Probe: b}
	return !d.Decide(&s.ds[0]).Drop
}

// decided reports whether a read's result is a datagram to decide: any
// datagram, even with an error (Windows reports a datagram longer than the
// buffer with one).
func decided(n int, err error) bool { return err == nil || n > 0 }

// ReadFromUDPAddrPort reads the next datagram the Decider keeps.
func (c *Conn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	for {
		n, src, err := c.UDPConn.ReadFromUDPAddrPort(b)
		if decided(n, err) && !c.keep(c.Decider(), b[:n], src) {
			continue
		}
		return n, src, err
	}
}

// ReadFromUDP reads the next datagram the Decider keeps.
func (c *Conn) ReadFromUDP(b []byte) (int, *net.UDPAddr, error) {
	for {
		n, src, err := c.UDPConn.ReadFromUDP(b)
		if decided(n, err) && !c.keep(c.Decider(), b[:n], src.AddrPort()) {
			continue
		}
		return n, src, err
	}
}

// ReadFrom reads the next datagram the Decider keeps.
func (c *Conn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, src, err := c.ReadFromUDP(b)
	if src == nil {
		return n, nil, err
	}
	return n, src, err
}

// Read reads the next datagram the Decider keeps.
func (c *Conn) Read(b []byte) (int, error) {
	n, _, err := c.ReadFromUDPAddrPort(b)
	return n, err
}

// ReadMsgUDPAddrPort reads the next datagram the Decider keeps, with its
// control messages.
func (c *Conn) ReadMsgUDPAddrPort(b, oob []byte) (n, oobn, flags int, src netip.AddrPort, err error) {
	for {
		n, oobn, flags, src, err = c.UDPConn.ReadMsgUDPAddrPort(b, oob)
		if decided(n, err) && !c.keep(c.Decider(), b[:n], src) {
			continue
		}
		return n, oobn, flags, src, err
	}
}

// ReadMsgUDP reads the next datagram the Decider keeps, with its control
// messages.
func (c *Conn) ReadMsgUDP(b, oob []byte) (n, oobn, flags int, src *net.UDPAddr, err error) {
	for {
		n, oobn, flags, src, err = c.UDPConn.ReadMsgUDP(b, oob)
		if decided(n, err) && !c.keep(c.Decider(), b[:n], src.AddrPort()) {
			continue
		}
		return n, oobn, flags, src, err
	}
}

// ReadBatch reads datagrams into ms as quic-go's batched reader does
// (ipv4.PacketConn.ReadBatch: recvmmsg on Linux, one datagram per call
// elsewhere) and returns those the Decider keeps, in ms[:n], in the order
// they arrived. If it drops a whole batch it reads again, until a datagram
// is kept, the read deadline passes or the socket is closed: it never
// returns 0 without an error.
//
// Each message keeps its own Buffers (quic-go pairs ms[i] with a buffer of
// its pool): a kept datagram is copied into the buffers of an earlier slot,
// with its length, control messages, address and flags. Slots are assumed
// alike, as quic-go's are; a shorter slot gets the datagram cut, with
// MSG_TRUNC or MSG_CTRUNC set.
func (c *Conn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	for {
		n, err := c.readBatch(ms, flags)
		if n <= 0 { // x/net returns -1 with an error, as recvmmsg does
			if err != nil {
				return 0, err
			}
			continue
		}
		d := c.Decider()
		if d == nil {
			return n, err
		}
		if kept := c.filterBatch(d, ms[:n]); kept > 0 || err != nil {
			return kept, err
		}
	}
}

// chunk is how many datagrams filterBatch decides under one lock; quic-go
// reads 8 at a time.
const chunk = 64

// filterBatch decides the datagrams of ms and moves those kept to the front,
// in order, returning how many there are.
func (c *Conn) filterBatch(d Decider, ms []ipv4.Message) int {
	s := &c.scratch
	s.mu.Lock()
	defer s.mu.Unlock()
	ds, drop := &s.ds, &s.drop
	w := 0
	for off := 0; off < len(ms); off += chunk {
		part := ms[off:min(off+chunk, len(ms))]
		for i := range part {
			c.datagramOf(&part[i], &ds[i])
		}
		d.DecideBatch(ds[:len(part)], drop[:len(part)])
		for i := range part {
			if drop[i] {
				continue
			}
			if w != off+i {
				moveMessage(&ms[w], &part[i])
			}
			w++
		}
	}
	return w
}

// datagramOf fills d with what a Decider reads of the datagram in m.
func (c *Conn) datagramOf(m *ipv4.Message, d *decide.Datagram) {
	var src netip.AddrPort
	if a, ok := m.Addr.(*net.UDPAddr); ok {
		src = a.AddrPort()
	}
	var first []byte
	if len(m.Buffers) > 0 {
		first = m.Buffers[0][:min(m.N, len(m.Buffers[0]))]
	}
	*d = decide.Datagram{Key: c.key(src), Length: m.N, Probe: first}
}

// moveMessage copies the datagram in src into dst's own buffers.
func moveMessage(dst, src *ipv4.Message) {
	left := src.N
	n := 0
	si, so := 0, 0 // source buffer and offset
	for _, db := range dst.Buffers {
		for len(db) > 0 && left > 0 && si < len(src.Buffers) {
			k := copy(db, src.Buffers[si][so:min(len(src.Buffers[si]), so+left)])
			db, n, left, so = db[k:], n+k, left-k, so+k
			if so == len(src.Buffers[si]) {
				si, so = si+1, 0
			}
		}
	}
	dst.N = n
	dst.NN = copy(dst.OOB, src.OOB[:src.NN])
	dst.Addr = src.Addr
	dst.Flags = src.Flags
	if n < src.N {
		dst.Flags |= msgTrunc
	}
	if dst.NN < src.NN {
		dst.Flags |= msgCtrunc
	}
}
