// Package learntest checks, with a real quic-go server and client on
// loopback, that a packet conn teaches a learn.Learner what a verifying
// filter needs, before the client needs it. The tests of packages learn,
// packetconn and userspace share it.
package learntest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
	"github.com/rakelimit/caddy-rakelimit/internal/testutil"
)

// alpn is the application protocol of the test exchange.
const alpn = "rakelimit-learn-test"

// Sink records what a Learner teaches it. It is safe for concurrent use.
type Sink struct {
	mu     sync.Mutex
	ids    map[Bound]int
	peers  map[netip.Addr]int
	credit map[netip.Addr]int
}

// Bound is a server ID with the address it was bound to.
type Bound struct {
	ID learn.ServerID
	To netip.Addr
}

// NewSink returns an empty Sink.
func NewSink() *Sink {
	return &Sink{ids: map[Bound]int{}, peers: map[netip.Addr]int{}, credit: map[netip.Addr]int{}}
}

// LearnServerID records id bound to to.
func (s *Sink) LearnServerID(id learn.ServerID, to netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids[Bound{id, to}]++
	return nil
}

// LearnPeer records addr; a new peer starts with decide.CreditFirst, as
// the filter's do.
func (s *Sink) LearnPeer(addr netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peers[addr] == 0 {
		s.credit[addr] += decide.CreditFirst
	}
	s.peers[addr]++
	return nil
}

// Grant adds credits to addr.
func (s *Sink) Grant(addr netip.Addr, credits int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.credit[addr] += credits
	return nil
}

// Credit returns the credits granted to addr.
func (s *Sink) Credit(addr netip.Addr) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.credit[addr]
}

// Times returns how many times id was taught bound to to, and to as a
// peer.
func (s *Sink) Times(id learn.ServerID, to netip.Addr) (ids, peers int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[Bound{id, to}], s.peers[to]
}

// KnowsID reports whether id was taught bound to to; an ID of another
// length never was.
func (s *Sink) KnowsID(id []byte, to netip.Addr) bool {
	if len(id) != learn.ServerIDLen {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[Bound{learn.ServerID(id), to}] > 0
}

// IDs returns what was taught: each server ID with its address.
func (s *Sink) IDs() []Bound {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Bound, 0, len(s.ids))
	for b := range s.ids {
		out = append(out, b)
	}
	return out
}

// KnowsPeer reports whether addr was taught.
func (s *Sink) KnowsPeer(addr netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peers[addr] > 0
}

// Counts returns how many distinct IDs and peers were taught.
func (s *Sink) Counts() (ids, peers int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids), len(s.peers)
}

// NewLearner returns a learner with the default options that teaches a
// new Sink.
func NewLearner(t testing.TB) (*Sink, *learn.Learner) {
	t.Helper()
	sink := NewSink()
	l, err := learn.NewLearner(sink, learn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return sink, l
}

// TLSConfigs returns a server configuration with a fresh self-signed
// certificate for localhost, and a client configuration that trusts it.
func TLSConfigs(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{alpn}}
	client = &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{alpn}}
	return server, client
}

// Wrap wraps the server's socket so that what quic-go writes through the
// result teaches l.
type Wrap func(t testing.TB, conn *net.UDPConn, l *learn.Learner) net.PacketConn

// Setup chooses a run of Check.
type Setup struct {
	// Version is the QUIC version both ends speak.
	Version quic.Version
	// Retry makes the server ask for a Retry before every handshake.
	Retry bool
}

// Kinds of packets the client sends to a server-chosen ID, the index of
// Report's counts.
const (
	Initial = iota
	Handshake
	Short
	numKinds
)

// Report counts what the client sent, each packet judged when the client
// recorded it, before it left.
type Report struct {
	// Retries counts the Retry packets the client received, and
	// RetryAnswers its Initials to a Retry's ID.
	Retries, RetryAnswers int
	// Revealed counts the IDs the client read in the source connection ID
	// of the server's long headers: all the learner can see. The client
	// has the others from NEW_CONNECTION_ID frames, which are encrypted.
	Revealed int
	// ByID counts, per kind, the client's packets to a revealed ID that
	// the sink knew bound to the client's address when the client sent
	// them (a long header among them proves the address to a filter),
	// ByPeer those to another ID (one the server issued encrypted, which
	// the sink cannot know) sent once the client had proven its address,
	// Credited those to another ID from an address the sink knew as a
	// peer with credit left (what the sink was granted less what the
	// client's earlier such packets spent: a filter verifies them on
	// credit), and OverCredit those sent with none left: a filter holds a
	// Handshake or short-header one at the unverified class's limits.
	// Opening counts the client's Initials to a server ID the sink did
	// not know bound to it then, from a stranger, of the opening class as
	// its first ones.
	ByID, ByPeer, Credited, OverCredit [numKinds]int
	Opening                            int
	// Proven says whether the client proved its address.
	Proven bool
	// Failures lists the packets to a server-chosen ID that a filter the
	// sink taught could verify neither way when the client sent them.
	Failures []string
	// Counts are the learner's counters at the end.
	Counts learn.Counts
}

// Check serves an echo server with quic-go, configured as Caddy configures
// it, over wrap of a dual-stack socket, and runs a quic-go client from
// 127.0.0.1 that echoes small streams and one of 1 MB. A tracer on the
// client judges each packet it sends to a server-chosen ID (every packet
// but its first Initials) when quic-go records it, before the packet
// leaves, as a filter the sink taught would class it (see Report). No
// Handshake or short-header packet may be a stranger's, nor sent out of
// credit: every one is verified, by its ID, its proven address or its
// credit. It returns what it counted.
func Check(t *testing.T, wrap Wrap, s Setup) Report {
	t.Helper()
	serverTLS, clientTLS := TLSConfigs(t)
	sink, l := NewLearner(t)
	conn := testutil.Listen(t, "udp", "[::]:0")
	port := uint16(conn.LocalAddr().(*net.UDPAddr).Port)
	tr := &quic.Transport{Conn: wrap(t, conn, l)}
	if s.Retry {
		tr.VerifySourceAddress = func(net.Addr) bool { return true }
	}
	Serve(t, tr, serverTLS, ServerConfig(s.Version))

	client := testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))
	from := client.LocalAddr().(*net.UDPAddr).AddrPort().Addr()
	rec := &recorder{sink: sink, from: from, revealed: map[string]bool{}}
	ctr := &quic.Transport{Conn: client}
	t.Cleanup(func() { ctr.Close() })
	payloads := [][]byte{[]byte("ping"), []byte("pong"), bytes.Repeat([]byte("0123456789abcdef"), 1<<16)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := &quic.Config{Versions: []quic.Version{s.Version}, Tracer: rec.trace}
	if err := exchange(ctx, ctr, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), clientTLS, cfg, payloads); err != nil {
		t.Fatal(err)
	}

	r := rec.report()
	r.Counts = l.Counts()
	for _, f := range r.Failures {
		t.Error(f)
	}
	// A burst the client sends before the server's answers grant more
	// credit may run past it, a few packets at most: a filter holds them
	// at the unverified class's limits.
	if verified := r.ByID[Short] + r.ByPeer[Short] + r.Credited[Short]; verified == 0 ||
		r.OverCredit[Short]+r.OverCredit[Handshake] > verified/50 {
		t.Errorf("the client sent %d verified short-header packets, and %d short-header and %d Handshake packets "+
			"out of credit (%+v)", verified, r.OverCredit[Short], r.OverCredit[Handshake], r)
	}
	if s.Retry && (r.Retries == 0 || r.RetryAnswers == 0) {
		t.Errorf("the client received %d Retry packets and answered with %d Initials", r.Retries, r.RetryAnswers)
	}
	// A Retry is a stateless reply: its ID is not taught, and the answers
	// to it are a stranger's Initials.
	if id := rec.retry(); id != nil && sink.KnowsID(id, from) {
		t.Errorf("the Retry's ID %x was taught", id)
	}
	if !sink.KnowsPeer(from) {
		t.Errorf("the client's address %v was not taught as a peer", from)
	}
	if r.Counts.OddIDs != 0 || r.Counts.Errors != 0 {
		t.Errorf("learner counts %+v: odd IDs or sink errors", r.Counts)
	}
	return r
}

// ServerConfig is the quic-go configuration Caddy serves HTTP/3 with,
// speaking only version v.
func ServerConfig(v quic.Version) *quic.Config {
	return &quic.Config{Versions: []quic.Version{v}, InitialPacketSize: 1200, Allow0RTT: true}
}

// Serve runs an echo server on tr with quic-go's early listener, as Caddy
// does: every stream is echoed back. It stops when the test ends.
func Serve(t testing.TB, tr *quic.Transport, tlsConf *tls.Config, cfg *quic.Config) {
	t.Helper()
	ln, err := tr.ListenEarly(tlsConf, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); tr.Close() })
	go func() {
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				for {
					s, err := conn.AcceptStream(context.Background())
					if err != nil {
						return
					}
					go func() {
						io.Copy(s, s)
						s.Close()
					}()
				}
			}()
		}
	}()
}

// capture is a client's packet conn that sends nothing and keeps what it
// would have sent.
type capture struct {
	net.PacketConn
	mu  sync.Mutex
	out [][]byte
}

// WriteTo keeps b.
func (c *capture) WriteTo(b []byte, _ net.Addr) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out = append(c.out, bytes.Clone(b))
	return len(b), nil
}

// FirstFlight returns the datagrams a quic-go client of version v sends in
// 200 ms to open a connection to to, to a server that never answers: its
// ClientHello (in one or more Initials) and a few retransmissions. A test
// sends them again from another address, as a spoofer would. The client's
// socket sends nothing.
func FirstFlight(t testing.TB, to netip.AddrPort, tlsConf *tls.Config, v quic.Version) [][]byte {
	t.Helper()
	c := &capture{PacketConn: testutil.Sender(t, netip.MustParseAddrPort("127.0.0.1:0"))}
	tr := &quic.Transport{Conn: c}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(to), tlsConf, &quic.Config{Versions: []quic.Version{v}}); err == nil {
		t.Fatal("a client that sends nothing connected")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.out) == 0 {
		t.Fatal("the client sent nothing")
	}
	return c.out
}

// exchange dials addr through tr and echoes each payload.
func exchange(ctx context.Context, tr *quic.Transport, addr netip.AddrPort, tlsConf *tls.Config, cfg *quic.Config, payloads [][]byte) error {
	conn, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(addr), tlsConf, cfg)
	if err != nil {
		return fmt.Errorf("dialing %v: %w", addr, err)
	}
	defer conn.CloseWithError(0, "")
	return Echo(ctx, conn, payloads)
}

// Echo sends each payload on a stream of its own of conn, to a server that
// Serve runs, and checks that it comes back whole.
func Echo(ctx context.Context, conn *quic.Conn, payloads [][]byte) error {
	for i, p := range payloads {
		s, err := conn.OpenStreamSync(ctx)
		if err != nil {
			return fmt.Errorf("opening stream %d: %w", i, err)
		}
		// Write while reading: the echo fills the client's receive window
		// long before a large payload is written, and a writer that does
		// not read would deadlock with the server on flow control.
		wrote := make(chan error, 1)
		go func() {
			_, err := s.Write(p)
			wrote <- errors.Join(err, s.Close())
		}()
		got, err := io.ReadAll(s)
		if werr := <-wrote; werr != nil {
			return fmt.Errorf("writing stream %d: %w", i, werr)
		}
		if err != nil {
			return fmt.Errorf("reading stream %d: %w", i, err)
		}
		if !bytes.Equal(got, p) {
			return fmt.Errorf("stream %d echoed %d bytes, sent %d", i, len(got), len(p))
		}
	}
	return nil
}

// recorder judges the client's packets as quic-go records them.
type recorder struct {
	sink *Sink
	from netip.Addr
	mu   sync.Mutex
	// revealed are the IDs the client read in the server's long headers.
	revealed map[string]bool
	// retryID is the source connection ID of the last Retry received.
	retryID []byte
	// proved is set once the client sent a long header to an ID the sink
	// knew bound to its address: a filter then knows the address as
	// proven (its proof pacer permitting).
	proved bool
	// spent counts the credits the client's packets spent.
	spent int
	r     Report
}

// trace is the client's quic.Config.Tracer.
func (rec *recorder) trace(context.Context, bool, quic.ConnectionID) qlogwriter.Trace { return rec }

// AddProducer returns rec: it records every producer's events.
func (rec *recorder) AddProducer() qlogwriter.Recorder { return rec }

// SupportsSchemas reports false: rec reads quic-go's own events only.
func (rec *recorder) SupportsSchemas(string) bool { return false }

// Close does nothing.
func (rec *recorder) Close() error { return nil }

// kinds are the packet types judged, by kind.
var kinds = map[qlog.PacketType]int{qlog.PacketTypeInitial: Initial, qlog.PacketTypeHandshake: Handshake, qlog.PacketType1RTT: Short}

// RecordEvent notes the IDs of the server's long headers the client
// receives, and judges each packet the client is about to send.
func (rec *recorder) RecordEvent(ev qlogwriter.Event) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	switch ev := ev.(type) {
	case qlog.PacketReceived:
		h := ev.Header
		if h.PacketType == qlog.PacketType1RTT || h.PacketType == qlog.PacketTypeVersionNegotiation {
			return
		}
		scid := h.SrcConnectionID.Bytes()
		if !rec.revealed[string(scid)] {
			rec.revealed[string(scid)] = true
			rec.r.Revealed++
		}
		if h.PacketType == qlog.PacketTypeRetry {
			rec.r.Retries++
			rec.retryID = bytes.Clone(scid)
		}
	case qlog.PacketSent:
		rec.judge(ev.Header)
	}
}

// judge counts a packet with header h the client is about to send.
func (rec *recorder) judge(h qlog.PacketHeader) {
	kind, ok := kinds[h.PacketType]
	dcid := h.DestConnectionID.Bytes()
	if !ok || len(dcid) != learn.ServerIDLen {
		return // the client's own first ID is at least 8 bytes long
	}
	if h.PacketType == qlog.PacketTypeInitial && bytes.Equal(dcid, rec.retryID) {
		rec.r.RetryAnswers++
	}
	switch {
	case rec.revealed[string(dcid)] && rec.sink.KnowsID(dcid, rec.from):
		rec.r.ByID[kind]++
		rec.proved = rec.proved || kind != Short && rec.sink.KnowsPeer(rec.from)
	case rec.proved:
		rec.r.ByPeer[kind]++
	case rec.sink.KnowsPeer(rec.from) && rec.sink.Credit(rec.from) > rec.spent:
		rec.r.Credited[kind]++
		rec.spent++
	case rec.sink.KnowsPeer(rec.from):
		rec.r.OverCredit[kind]++
	case kind == Initial:
		rec.r.Opening++
	default:
		rec.r.Failures = append(rec.r.Failures, fmt.Sprintf(
			"the client sent a %s packet (number %d) to %x from %v, which the sink knew neither as a peer nor by that ID",
			h.PacketType, h.PacketNumber, dcid, rec.from))
	}
	rec.r.Proven = rec.proved
}

// retry returns the source connection ID of the last Retry received.
func (rec *recorder) retry() []byte {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.retryID
}

// report returns what rec counted.
func (rec *recorder) report() Report {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r := rec.r
	r.Failures = append([]string(nil), r.Failures...)
	return r
}
