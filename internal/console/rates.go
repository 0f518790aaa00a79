package console

import (
	"sort"
	"strconv"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// Snapshot is the admin view read at one time.
type Snapshot struct {
	At   time.Time
	View report.View
}

// ClassRates are one limiter class's packets per second, all families
// together.
type ClassRates struct {
	Name    string
	Passed  float64
	Limited float64
	// Dropped and DryRun are by level.
	Dropped []float64
	DryRun  []float64
}

// DroppedTotal is the class's drops over every level, dry run included.
func (c ClassRates) DroppedTotal() float64 { return sum(c.Dropped) + sum(c.DryRun) }

// Rates are a limiter's packets per second between two snapshots.
type Rates struct {
	// Seconds is the time between the snapshots.
	Seconds float64
	// Classes are the limiter classes in a fixed order: opening (or
	// all), established, unverified, then any other.
	Classes []ClassRates
	// Negotiation is by verdict: passed, dropped, dry_run.
	Negotiation map[string]float64
	// Invalid is by reason (dropped and dry run together).
	Invalid     map[string]float64
	Allowlisted float64
	Verified    float64
	// Untracked are the drops of streams too many to track: a new source
	// on every packet.
	Untracked float64
}

// InvalidTotal is the invalid datagrams per second over every reason.
func (r *Rates) InvalidTotal() float64 {
	t := 0.0
	for _, v := range r.Invalid {
		t += v
	}
	return t
}

// Class returns the rates of the class named name, or nil.
func (r *Rates) Class(name string) *ClassRates {
	for i := range r.Classes {
		if r.Classes[i].Name == name {
			return &r.Classes[i]
		}
	}
	return nil
}

// classOrder sorts the limiter classes for display.
var classOrder = map[string]int{"opening": 0, "all": 0, "established": 1, "unverified": 2}

// RatesOf computes the rates of the limiter named name between prev and
// cur; nil when prev lacks it or the snapshots are not in order. A counter
// that went back (a restart) counts as 0.
func RatesOf(prev, cur Snapshot, name string) *Rates {
	p, c := find(prev.View, name), find(cur.View, name)
	secs := cur.At.Sub(prev.At).Seconds()
	if p == nil || c == nil || secs <= 0 {
		return nil
	}
	levels := len(c.Config.LevelLimits)
	r := &Rates{Seconds: secs, Negotiation: map[string]float64{}, Invalid: map[string]float64{}}
	classes := map[string]*ClassRates{}
	for fam, cc := range c.Counters {
		pc := p.Counters[fam]
		for name, k := range cc.Classes {
			pk := pc.Classes[name]
			cr := classes[name]
			if cr == nil {
				cr = &ClassRates{Name: name, Dropped: make([]float64, levels), DryRun: make([]float64, levels)}
				classes[name] = cr
			}
			cr.Passed += delta(pk.Passed, k.Passed, secs)
			for lvl := range levels {
				key := strconv.Itoa(lvl)
				cr.Limited += delta(pk.Limited[key], k.Limited[key], secs)
				cr.Dropped[lvl] += delta(pk.Dropped[key], k.Dropped[key], secs)
				cr.DryRun[lvl] += delta(pk.DryRun[key], k.DryRun[key], secs)
			}
		}
		for verdict, n := range cc.Negotiation {
			r.Negotiation[verdict] += delta(pc.Negotiation[verdict], n, secs)
		}
		for reason, n := range cc.Invalid {
			r.Invalid[reason] += delta(pc.Invalid[reason], n, secs)
		}
		for reason, n := range cc.InvalidDryRun {
			r.Invalid[reason] += delta(pc.InvalidDryRun[reason], n, secs)
		}
		r.Allowlisted += delta(pc.Allowlisted, cc.Allowlisted, secs)
		for how, n := range cc.Verified {
			r.Verified += delta(pc.Verified[how], n, secs)
		}
	}
	r.Untracked = delta(p.UntrackedDrops, c.UntrackedDrops, secs)
	for _, cr := range classes {
		r.Classes = append(r.Classes, *cr)
	}
	sort.Slice(r.Classes, func(i, j int) bool {
		oi, iok := classOrder[r.Classes[i].Name]
		oj, jok := classOrder[r.Classes[j].Name]
		if iok != jok {
			return iok
		}
		if oi != oj {
			return oi < oj
		}
		return r.Classes[i].Name < r.Classes[j].Name
	})
	return r
}

// find returns the limiter named name in v, or nil.
func find(v report.View, name string) *report.Limiter {
	for i := range v.Limiters {
		if v.Limiters[i].Name == name {
			return &v.Limiters[i]
		}
	}
	return nil
}

// delta is the rate of a counter that went from a to b in secs seconds.
func delta(a, b uint64, secs float64) float64 {
	if b < a {
		return 0
	}
	return float64(b-a) / secs
}

func sum(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t
}
