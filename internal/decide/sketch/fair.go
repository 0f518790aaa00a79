package sketch

// The fair total, and the returning part of it: the twin of
// internal/kernel/c/fair.h.

// The fair total. When the socket's total enforces its limit, a packet
// passes if its source (address and port, ranked anew every period) is
// admitted: rank * network <= share * 2^16, where network is the rate of the
// packet's network (/24, /48) as a count, rank is uniform in [0, 2^32), and
// share is the fair share as a count times 2^16. A network sending r is so
// admitted at min(r, fair share): max-min fairness. Core-stateless fair
// queueing finds the fair share from the accepted rate; here it is found
// from the packets themselves, by stochastic approximation: the share
// should admit the fraction f = thr/total of what arrives (total, the
// total's offered rate, thr its limit), so every admitted packet shrinks it
// by 1/2^FairStep of itself times 1 - f, and every refused one grows it by
// 1/2^FairStep times f; the two balance exactly when the admitted fraction
// is f. Below the limit the share is FairUnbounded. A network under the fair
// share loses nothing, and over it whole sources are refused rather than a
// random share of everyone's packets, so that the handshakes let through
// complete (RFC 9312, section 4.4).
//
// The share sees a network through its estimate, and under a spoofed flood
// (a new random source on every packet) every network's estimate is the
// count of a cell that many networks share: a quiet network's is its own
// rate plus that, higher than a flooding network's, so the share admits it
// less than a proportional drop would. A packet the rank refuses is
// therefore still admitted, with the probability that brings its network up
// to f (the proportional floor, see admitFair), so that no network keeps
// less than f of its packets. A network the share admits at f or more never
// needs the floor.
const FairStep = 8 // C: FAIR_STEP

// FairUnbounded is the fair share that admits every packet.
const FairUnbounded = 1<<48 - 1 // C: FAIR_UNBOUNDED

// FairSlack bounds the fair total while its share settles: as a flood
// starts, the offered rate is still ramping up and the share admits too
// much. Once the forwarded count is over the limit, the share and the floor
// admit less in proportion, down to nothing at thr + thr/2^FairSlack: twice
// the limit. The forwarded count counts what the share admits, not what the
// floor adds (see judgeFloor): the share holds it at the limit, and so the
// floor is not scaled once the share has settled, however much it adds.
// That scaling cuts every network alike, one under the fair share too, so
// its range is wide: with a range of a quarter of the limit, a network near
// the fair share lost packets in every pulse of a flood that stops and
// starts (scenario quiet-network-pulse, and the end-to-end benchmark's
// pulse).
const FairSlack = 0 // C: FAIR_SLACK

// The coin of the proportional floor is FairCoinBits bits of the packet's
// random number, from bit FairCoinShift: under its top FracBits bits (the
// dither) and above the low bits that sample drops for tracking.
const (
	FairCoinBits  = 16                           // C: FAIR_COIN_BITS
	FairCoinShift = 32 - FracBits - FairCoinBits // C: FAIR_COIN_SHIFT
)

// fairCoin is the coin of the proportional floor, uniform in
// [0, 2^FairCoinBits), from the packet's random number rnd.
func fairCoin(rnd uint32) uint32 {
	return rnd >> FairCoinShift & (1<<FairCoinBits - 1)
}

// Verdicts of admitFair.
const (
	// fairRefuse: the packet is dropped.
	fairRefuse = iota // C: FAIR_REFUSE
	// fairRank: the share admits the packet's source.
	fairRank // C: FAIR_RANK
	// fairFloor: the proportional floor admits the packet.
	fairFloor // C: FAIR_FLOOR
)

// admitFair decides a packet at the fair total and moves the share
// (admit_fair in the C program). The total's offered count nw.omin is over
// its limit thr (scaled to the packet's slot), and so is its forwarded count
// nw.fmin: under it there is room, and judgeNode lets the packet pass without
// asking. rank is the rank of the packet's source, nw.network the estimate
// of its network (not zero) and nw.coin the packet's coin.
//
// The rank admits the packet when rank * network <= bar * 2^16, where bar is
// the share scaled down while the forwarded count is over the limit (see
// FairSlack): its network keeps p = bar / (network * 2^16) of its packets.
// The floor is f = thr/total, scaled alike. When p is under it, a packet the
// rank refuses is admitted with probability (floor - p) / (1 - p), so that
// its network keeps the floor in all: coin * (network*2^16 - bar) <
// (floor*network - bar) * 2^16, with the floor as a fraction times 2^16
// (bar < network*2^16, or the rank would have admitted the packet; every
// product stays under 2^64). The share learns from the rank alone.
func admitFair(share *uint64, nw *nodeWork, rank uint32, thr uint64) int {
	network, total, forwarded := uint64(nw.network), uint64(nw.omin), uint64(nw.fmin)
	want := uint64(rank) * network
	bar := *share
	f := thr << 16 / total
	floor := f
	if slack := thr >> FairSlack; forwarded > thr && slack > 0 {
		k := (thr + slack - min(forwarded, thr+slack)) << 16 / slack
		bar = bar * k >> 16
		floor = floor * k >> 16
	}
	// The share learns from whether it admits the packet, not from what
	// the forwarded count or the floor make of that.
	step := *share>>FairStep + 1
	if want <= *share<<16 {
		*share -= step * (1<<16 - f) >> 16
	} else {
		*share = min(*share+step*f>>16+1, FairUnbounded)
	}
	if want <= bar<<16 {
		return fairRank
	}
	if fl := floor * network; fl > bar && uint64(nw.coin)*(network<<16-bar) < (fl-bar)<<16 {
		return fairFloor
	}
	return fairRefuse
}

// admitTotal decides a packet over the fair total's limit t, in nw's
// counts, at the end of the walk (admit_total in the C program). A
// returning user's packet while the returning part of the total has room
// (Params.Returning) passes, and is counted in the part's cell
// (Params.ReturningLine); any other is ranked (rankRest).
func (l *Limiter) admitTotal(share *uint64, k *Key, nw *nodeWork, t uint64) int {
	if k.Returning {
		var ok bool
		if ok, l.returningTAT = l.p.Returning.Admit(l.returningTAT, nw.now); ok {
			c := &l.lines[l.p.ReturningLine].Cells[0]
			refresh(l.p, c, nw.epoch)
			forwardOne(&c.Budget[Clean], nw.w)
			return fairRank
		}
	}
	return l.rankRest(share, k, nw, t)
}

// rankRest ranks by admitFair a packet over the fair total's limit t that
// the returning part does not pass (rank_rest in the C program), against
// what the part leaves: the total's offered and forwarded counts and its
// limit less what the part passed, so that the share and the proportional
// floor give the others the rest of the limit, and the part and the rest
// together hold the total. The screen asks it too: it never screens a
// returning user's packet.
func (l *Limiter) rankRest(share *uint64, k *Key, nw *nodeWork, t uint64) int {
	c := &l.lines[l.p.ReturningLine].Cells[0]
	r := uint32(mulQ32(uint64(c.Budget[Clean].Forwarded), idleFactor(l.p, c.Epoch, nw.epoch)))
	rest := *nw
	rest.omin, rest.fmin = lessPart(nw.omin, r), lessPart(nw.fmin, r)
	return admitFair(share, &rest, l.hk.rank(k, nw.now>>PeriodShift), uint64(lessPart(uint32(min(t, uint64(maxU32))), r)))
}

// lessPart is n less the returning part's count r, at least 1 (less_part
// in the C program): the part passed at most what the total counted.
func lessPart(n, r uint32) uint32 {
	if n > r {
		return n - r
	}
	return 1
}
