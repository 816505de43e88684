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
// commit's WAL flush) fewer times. At moderate concurrency the statements hold about twice the
// acquires and PostgreSQL's CPU per acquire falls; at high concurrency, where batches are large
// without it, it gains nothing beyond the noise (measured:
// docs/operations.md "Figures behind the code").
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
	// between acquires lose with any lingering, under LingerOn most (measured:
	// docs/operations.md "Figures behind the code").
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
// commit) and a part per acquire, and by 16 acquires the fixed part is under half of the
// statement, so a larger batch saves little. Beyond it lingering only idles the slot: at high
// concurrency, lingering for every caller to come back decided fewer acquires a second
// (measured: docs/operations.md "Figures behind the code").
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
