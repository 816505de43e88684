package services

import (
	"fmt"
	"time"
)

// LingerMode says whether group admission lingers: after a statement of several acquires, with
// fewer than groupLingerTarget acquires waiting, its slot stays idle for a moment, until the
// callers that statement just answered have sent their next acquires, so that those go in one
// statement with the acquires already waiting instead of in a statement of their own. Fewer,
// larger statements pay a statement's fixed cost (a round trip, the executor's start-up, a
// commit's WAL flush) fewer times. Measured over HTTP on a 2-core machine with PostgreSQL and
// the load on the same cores (sets of 5-6 pairs of 8-10 s runs in turns, or make bench's 3,
// medians), lingering against not: a retry storm on one key 1.06–1.12× the acquires per second
// at 16 connections and 0.98–1.03× at 64; new keys 1.04–1.05× at 16. New keys at 64
// connections, where batches are large without it, gain nothing beyond the noise: set medians
// 0.93–1.20×, 0.99× over six pairs in rotated order. At 16 connections the statements held
// 15.7 acquires instead of 7.7, and PostgreSQL's CPU per acquire fell by a third.
//
// Lingering pays only when the callers answered come back within about a statement's time, as
// callers retrying or working through a queue back to back do; hence off by default. Callers
// that do other work between acquires, or independent requests arriving at random, do not:
// each linger then keeps the acquires already waiting waiting while those callers still
// pause. LingerAuto watches for that, too loosely (see LingerAuto).
type LingerMode int

const (
	// LingerOff, the default, never lingers: a statement starts as soon as the previous one
	// ends, with whatever waits (group admission before lingering existed). Callers that pause
	// between acquires lose with any lingering: 16 callers each pausing up to 3 ms answered
	// 0.74–0.77× as many acquires a second under LingerAuto and 0.62–0.66× under LingerOn (three
	// rounds of 5 s in turns).
	LingerOff LingerMode = iota
	// LingerAuto lingers while lingering gathers what it waits for: a linger that ends at its
	// bound with fewer than half of it makes the slot skip the next ones (see lingerControl).
	// Random arrivals often reach half, so it does not back off far enough for callers that
	// pause (see LingerOff).
	LingerAuto
	// LingerOn always lingers.
	LingerOn
)

// String is the mode's name as IDEMGATE_GROUP_LINGER takes it.
func (m LingerMode) String() string {
	switch m {
	case LingerAuto:
		return "auto"
	case LingerOn:
		return "on"
	}
	return "off"
}

// ParseLingerMode reads "auto", "on" or "off" (IDEMGATE_GROUP_LINGER). Any other value is an
// error naming the ones accepted.
func ParseLingerMode(s string) (LingerMode, error) {
	switch s {
	case "auto":
		return LingerAuto, nil
	case "on":
		return LingerOn, nil
	case "off":
		return LingerOff, nil
	}
	return LingerOff, fmt.Errorf("%q is not a linger mode (auto, on or off)", s)
}

// groupMaxLinger bounds one linger however long the statements take: "gathered for at most a
// few milliseconds".
const groupMaxLinger = 5 * time.Millisecond

// groupLingerTarget is the most acquires a linger waits for, and a slot with that many waiting
// does not linger at all. A statement's cost is a fixed part (round trip, executor start-up,
// commit) and a part per acquire: measured with pgbench from one client, 0.49 ms for 1 new key,
// 0.85 ms for 8 and 1.18 ms for 16, about 0.45 ms plus 45 µs a key, so by 16 acquires the
// fixed part is under 40% of the statement and a larger batch saves little. Beyond it lingering
// only idles the slot: at 64 connections, where batches held 27 acquires without lingering,
// lingering for all of them to come back (batches of 45 to 60) decided 8–12% fewer acquires a
// second (5 to 8 pairs of runs in turns).
const groupLingerTarget = 16

// lingerMaxSkip bounds LingerAuto's backoff: after lingers that keep ending at their bound, one
// linger in lingerMaxSkip+1 still looks whether the callers now come back in time.
const lingerMaxSkip = 64

// lingerControl is the slot's lingering rule. Under LingerAuto a linger that ends at its bound
// with fewer than half the acquires it waited for (the callers answered did not come back
// within it) makes the slot skip the next linger, then the next 2, 4, … up to lingerMaxSkip
// after each such linger in a row; a linger that gathers at least half ends the backoff. So where callers come back in time the slot
// lingers after every statement that allows it, and where they do not it wastes at most one
// linger in lingerMaxSkip+1.
//
// Only the goroutine holding group admission's statement slot uses it, and each takes the slot
// from the last under grouper.mu, so it needs no lock of its own.
type lingerControl struct {
	mode    LingerMode
	skip    int // lingers still to skip
	backoff int // the skip after the next linger that ends at its bound
}

// lingering reports whether the slot should linger now, after a statement of several
// acquires; a skipped linger counts as one of those to skip.
func (c *lingerControl) lingering() bool {
	switch c.mode {
	case LingerOn:
		return true
	case LingerOff:
		return false
	}
	if c.skip > 0 {
		c.skip--
		return false
	}
	return true
}

// lingered is told how a linger ended: gathered when at least half the acquires it waited for
// came, else it ended at its bound with fewer.
func (c *lingerControl) lingered(gathered bool) {
	if c.mode != LingerAuto {
		return
	}
	if gathered {
		c.backoff = 0
		return
	}
	c.backoff = min(max(1, 2*c.backoff), lingerMaxSkip)
	c.skip = c.backoff
}
