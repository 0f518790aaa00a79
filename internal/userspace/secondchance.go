package userspace

// ClockHand is the clock (second chance) choice of a slot to
// reuse in a full fixed-size table: a hand sweeps the slots in turn, spares
// once a slot referenced since it last passed, and settles on the first one
// that was not. The tables of tracked streams (streamTable) evict with it,
// so that, like the kernel's LRU maps, a flood of new keys evicts the keys
// no longer in use before those still in use.
// The zero value starts at slot 0.
type ClockHand struct{ pos int }

// Victim returns the slot to reuse among n, all in use. spared reports
// whether slot i was referenced since the hand last passed, and clears
// that mark: such a slot is passed over once.
func (h *ClockHand) Victim(n int, spared func(i int) bool) int {
	for {
		i := h.pos
		h.pos = (h.pos + 1) % n
		if !spared(i) {
			return i
		}
	}
}
