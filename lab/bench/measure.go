//go:build linux

package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
)

// measureFlood runs the flood (if any) and the clients for the flood
// duration.
func (b *bench) measureFlood(ctx context.Context, c *caddyProc, sc Scenario, res *RunResult) error {
	dst := c.dst()
	// The established client connects before the flood.
	est, err := dialH3(ctx, establishedSrc, dst)
	if err != nil {
		return fmt.Errorf("established client, before the flood: %w", err)
	}
	defer est.close()
	if _, err := est.get(ctx, "/", page, nil); err != nil {
		return fmt.Errorf("established client, before the flood: %w", err)
	}
	// The returning client's first visit, before the flood; a client
	// that keeps its connection keeps this one.
	var kept *h3Conn
	if sc.Returning {
		if sc.ReturningKeeps {
			if kept, err = dialH3(ctx, sc.returningAddr(), dst); err == nil {
				defer kept.close()
				_, err = kept.get(ctx, "/", page, nil)
			}
		} else {
			_, err = newConnGet(ctx, sc.returningAddr(), dst, "/", page)
		}
		if err != nil {
			return fmt.Errorf("returning client, before the flood: %w", err)
		}
	}
	var fl *flood
	var attacker *h3Conn
	if sc.Flood != nil {
		if attacker, fl, err = b.openFlood(ctx, sc, dst, res.Rep); err != nil {
			return err
		}
		defer fl.close()
		if attacker != nil {
			defer attacker.close()
		}
		if sc.Flood.Prove {
			bots, err := b.proveBots(ctx, c, fl.hosts, dst, seedOf(sc.Name, res.Rep), res)
			for _, h := range bots {
				defer h.close()
			}
			if err != nil {
				return err
			}
		}
	}
	w, err := b.begin(ctx, c)
	if err != nil {
		return err
	}
	d := b.o.floodDuration()
	var wg sync.WaitGroup
	var fres FloodResult
	if fl != nil {
		wg.Go(func() { fres = fl.run(ctx, d, b.o.FloodMax, seedOf(sc.Name, res.Rep)) })
	}
	var probes *prober
	if fl != nil && sc.Flood.PathProbes && attacker != nil {
		probes = &prober{conn: attacker.conn, hosts: fl.hosts}
		wg.Go(func() { probes.run(ctx, d) })
	}
	var opening *OpeningTimeline
	if sc.Timeline {
		wg.Go(func() { opening = sampleOpening(ctx, c, d) })
	}
	var stranger LegitStats
	if sc.Stranger {
		var next atomic.Int64
		wg.Go(func() {
			stranger = paced(ctx, d, requestRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
				return newConnGet(rctx, strangerAddr(int(next.Add(1)-1)), dst, "/", page)
			})
		})
	}
	var newConn, established, gtls LegitStats
	wg.Go(func() {
		newConn = paced(ctx, d, requestRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
			return newConnGet(rctx, newConnSrc, dst, "/", page)
		})
	})
	wg.Go(func() {
		established = paced(ctx, d, requestRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
			start := time.Now()
			_, err := est.get(rctx, "/", page, nil)
			return time.Since(start), err
		})
	})
	if b.gtls != "" {
		wg.Go(func() { gtls = b.gtlsDuring(ctx, d, dst.Port()) })
	}
	var attackerStats, returning, returningEst LegitStats
	if attacker != nil {
		wg.Go(func() {
			attackerStats = paced(ctx, d, attackerRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
				start := time.Now()
				_, err := attacker.get(rctx, "/", page, nil)
				return time.Since(start), err
			})
		})
	}
	if sc.Returning {
		wg.Go(func() {
			returning = paced(ctx, d, returningRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
				return newConnGet(rctx, sc.returningAddr(), dst, "/", page)
			})
		})
	}
	if kept != nil {
		wg.Go(func() {
			returningEst = paced(ctx, d, requestRate, b.o.Timeout, func(rctx context.Context) (time.Duration, error) {
				start := time.Now()
				_, err := kept.get(rctx, "/", page, nil)
				return time.Since(start), err
			})
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if probes != nil {
		// The paths' transports stop after the attacker's connection:
		// stopping one ends the connections it carries.
		attacker.close() // again when deferred: harmless
		pr := probes.finish()
		res.Probes = &pr
	}
	res.Opening = opening
	if fl != nil {
		fl.finish(&fres, reflectionGrace)
		res.Flood = &fres
		if fres.Sent == 0 {
			return fmt.Errorf("the flood sent nothing (%d send errors, first: %s)", fres.SendErrors, fres.FirstError)
		}
	}
	if err := w.end(ctx, res); err != nil {
		return err
	}
	res.NewConn, res.Established = &newConn, &established
	if b.gtls != "" {
		res.Gtls = &gtls
	}
	if sc.Flood != nil && sc.Flood.Attacker.IsValid() {
		res.Attacker = &attackerStats
	}
	if sc.Returning {
		res.Returning = &returning
	}
	if kept != nil {
		res.ReturningEstablished = &returningEst
	}
	if sc.Stranger {
		res.Stranger = &stranger
	}
	if newConn.Attempted == 0 || established.Attempted == 0 {
		return fmt.Errorf("no legitimate requests made (new connection %d, established %d)", newConn.Attempted, established.Attempted)
	}
	return nil
}

// openFlood opens the scenario's flood to dst and, before it runs, what it
// needs: the attacker's own connection (returned, nil without one), whose
// server ID it carries, and the warm-up's datagrams.
func (b *bench) openFlood(ctx context.Context, sc Scenario, dst netip.AddrPort, rep int) (*h3Conn, *flood, error) {
	spec := sc.Flood
	if spec.Kind.needsServerID() && !spec.Attacker.IsValid() {
		return nil, nil, fmt.Errorf("flood of %s needs an attacker's connection", spec.Kind)
	}
	var attacker *h3Conn
	var id [quicclass.ServerIDLen]byte
	if spec.Attacker.IsValid() {
		var err error
		if attacker, id, err = dialAttacker(ctx, spec.Attacker, dst); err != nil {
			return nil, nil, fmt.Errorf("attacker's connection, before the flood: %w", err)
		}
		if _, err := attacker.get(ctx, "/", page, nil); err != nil {
			attacker.close()
			return nil, nil, fmt.Errorf("attacker's connection, before the flood: %w", err)
		}
	}
	fail := func(err error) (*h3Conn, *flood, error) {
		if attacker != nil {
			attacker.close()
		}
		return nil, nil, err
	}
	fl, err := openFlood(spec, dst.Port())
	if err != nil {
		return fail(err)
	}
	fl.serverID = id
	if spec.Warmup {
		if n := spec.warmupFlights(); len(b.flights) < n {
			fmt.Fprintf(b.progress, "rakebench: making %d client first flights for the warm-up\n", n)
			if b.flights, err = clientFlights(ctx, n); err != nil {
				fl.close()
				return fail(err)
			}
		}
		if err := fl.prepareWarmup(b.flights, seedOf(sc.Name, rep)); err != nil {
			fl.close()
			return fail(err)
		}
	}
	return attacker, fl, nil
}

// proveBots makes each of hosts a proven bot (proveBots) and records in res
// how many and the rise of the module's proofs counter over the proving. It
// returns the bots' connections, open, also with an error.
func (b *bench) proveBots(ctx context.Context, c *caddyProc, hosts []netip.Addr, dst netip.AddrPort, seed uint64, res *RunResult) ([]*h3Conn, error) {
	m0, err := scrape(ctx, c)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	bots, err := proveBots(ctx, hosts, dst, seed)
	if err != nil {
		return nil, fmt.Errorf("proven bots, before the flood: %w", err)
	}
	br := &BotsResult{Bots: len(bots), Seconds: time.Since(start).Seconds()}
	res.Bots = br
	if err := sleepCtx(ctx, proofSettle); err != nil {
		return bots, err
	}
	m1, err := scrape(ctx, c)
	if err != nil {
		return bots, err
	}
	if _, module := learnedOf(m1.values(), proofsKind); module {
		p, _ := learnedOf(m1.delta(m0), proofsKind)
		br.Proofs = &p
	}
	return bots, nil
}

// gtlsDuring runs gtlsFetches gtlsclient fetches spread over d.
func (b *bench) gtlsDuring(ctx context.Context, d time.Duration, port uint16) LegitStats {
	var log requestLog
	start := time.Now()
	for i := 1; i <= gtlsFetches; i++ {
		at := start.Add(d * time.Duration(i) / (gtlsFetches + 1))
		select {
		case <-ctx.Done():
			return log.stats()
		case <-time.After(time.Until(at)):
		}
		lat, err := gtlsGet(ctx, b.gtls, b.dir, int(port), b.o.Timeout)
		if ctx.Err() != nil {
			return log.stats()
		}
		log.add(lat, err)
	}
	return log.stats()
}

// measureTransfers runs the transfers with no flood.
func (b *bench) measureTransfers(ctx context.Context, c *caddyProc, res *RunResult) error {
	w, err := b.begin(ctx, c)
	if err != nil {
		return err
	}
	id := fmt.Sprintf("%s-%d", res.Variant, res.Rep)
	trs, err := transfers(ctx, c.dst(), b.sizes, b.backend, id, b.o.transferTimeout(), b.o.stallTimeout())
	if err != nil {
		return err
	}
	res.Transfers = trs
	return w.end(ctx, res)
}

// seedOf derives a flood's seed from its scenario and repetition.
func seedOf(name string, rep int) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", name, rep)
	return h.Sum64()
}
