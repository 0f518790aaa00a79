//go:build linux

package learn

import (
	"net/netip"
	"testing"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass/quicclasstest"
)

// BenchmarkLearn measures Learn per call on datagrams already taught (the
// steady state of a server's writes), from parallel writers to distinct
// peers, as quic-go's connections write.
func BenchmarkLearn(b *testing.B) {
	batch := cat(quicclasstest.ShortHeader(1200), quicclasstest.ShortHeader(1200), quicclasstest.ShortHeader(1200), quicclasstest.ShortHeader(700))
	tests := []struct {
		name string
		b    []byte
		oob  []byte
	}{
		{"short header", quicclasstest.ShortHeader(1200), cmsgTOS()},
		{"GSO batch of 4", batch, cat(cmsgTOS(), segmentMsg(1200))},
		{"coalesced handshake", cat(quicclasstest.AppendLongPacket(nil, v1, typeInitial, client[:4], idA[:], nil, 300), handshakeTo(idA)), nil},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			l, _ := NewLearner(nopSink{}, Options{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var i byte
				for pb.Next() {
					i++
					l.Learn(tt.b, tt.oob, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 2, i}), 443))
				}
			})
		})
	}
}
