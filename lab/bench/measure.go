//go:build linux

package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sync"
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
	// The returning client's first visit, before the flood.
	if sc.Returning {
		if _, err := newConnGet(ctx, returningSrc, dst, "/", page); err != nil {
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
	var attackerStats, returning LegitStats
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
				return newConnGet(rctx, returningSrc, dst, "/", page)
			})
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
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
	if attacker != nil {
		res.Attacker = &attackerStats
	}
	if sc.Returning {
		res.Returning = &returning
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
		if len(b.flights) < spec.SpoofedSet {
			fmt.Fprintf(b.progress, "rakebench: making %d client first flights for the warm-up\n", spec.SpoofedSet)
			if b.flights, err = clientFlights(ctx, spec.SpoofedSet); err != nil {
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
