package history

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// clockSkew is how far apart the clients' clock and the database clock that produced
// expires_at may be, plus the imprecision of "the hold expired" (reaper timing, rounding).
const clockSkew = int64(time.Second)

// Kinds of calls in a history.
const (
	kindAcquire = "acquire"
	kindRelease = "release"
	kindOutcome = "outcome"
	kindGet     = "get"
	kindRenew   = "renew"
)

// callInput is what a client sent. Op is the operation id the client owns (release, outcome);
// BadToken marks a deliberately corrupted owner token.
type callInput struct {
	Kind     string
	Key      string
	Name     string
	FP       string
	TTL      int
	Lease    int  // lease_seconds of an acquire or renew; 0 is absent (lease = TTL)
	Hold     bool // on_expiry hold_until_reconciled
	Extend   bool // extend_ttl of a renew
	Op       string
	BadToken bool
	Status   string
	Release  bool
	Call     int64
	Attempt  string // attempt_id of an acquire, unique per call (see resolveLostAcquires)
}

// callOutput is what it got. Unknown: no answer (transport error, timeout, 5xx). Lost: an
// acquire whose answer was lost but which, the database shows, admitted operation OpID with
// fencing token Fencing (its expiry is unknown, as an unknown admission's). Exp is the answered
// expires_at in Unix nanoseconds and LeaseExp lease_expires_at (0 when absent); State the
// operation state in the answer.
type callOutput struct {
	Unknown  bool
	Lost     bool
	Status   int
	Code     string
	OpID     string
	Fencing  int64
	Exp      int64
	LeaseExp int64
	State    string
	Held     bool
	Ret      int64
}

// opInfo is the model's view of one operation. Exp 0 means unknown (an acquire with an
// unknown outcome): it may be considered expired, or live, at any time.
type opInfo struct {
	state   string
	outcome string // last recorded outcome status, "" if none
	fp      string
	name    string
	exp     int64
	lexp    int64 // lease end (docs/reference.md §8); 0 absent (the lease is the TTL), -1 unknown (a lost renew answer)
	hold    bool  // on_expiry hold_until_reconciled
	fencing int64
	// plo and phi bound when a success's horizon ends (docs/reference.md §2 "Lifecycle"): its
	// outcome call's start and return plus the horizon of its operation name; 0 without one.
	// Until then the key refuses new admissions, answered by the operation or its tombstone.
	plo, phi int64
}

// keyState is the model state of one key (the model is partitioned per key).
type keyState struct {
	fencing int64
	holder  string // operation id of the hold, "" when released (expiry is not applied eagerly)
	last    string // newest admitted operation
	ops     map[string]opInfo
}

func (s keyState) clone() keyState {
	ops := make(map[string]opInfo, len(s.ops)+1)
	for k, v := range s.ops {
		ops[k] = v
	}
	s.ops = ops
	return s
}

func (s keyState) with(id string, o opInfo) keyState {
	c := s.clone()
	c.ops[id] = o
	return c
}

func expiredBy(o opInfo, ret int64) bool { return o.exp == 0 || ret >= o.exp-clockSkew }
func liveAt(o opInfo, call int64) bool   { return o.exp == 0 || call <= o.exp+clockSkew }
func unseen(id string) bool              { return strings.HasPrefix(id, "?") }

// lapsedBy reports whether the lease may have lapsed by ret; leaseLiveAt whether it may still
// have run at call. Without a lease end in the answers (lexp 0) the lease is the TTL; after a
// renew whose answer was lost (lexp -1) it may end at any time until the hold's.
func lapsedBy(o opInfo, ret int64) bool {
	switch {
	case o.lexp == 0:
		return expiredBy(o, ret)
	case o.lexp < 0:
		return true
	}
	return ret >= o.lexp-clockSkew
}
func leaseLiveAt(o opInfo, call int64) bool {
	if o.lexp <= 0 {
		return liveAt(o, call)
	}
	return call <= o.lexp+clockSkew
}

// ended reports whether o has ended (docs/reference.md §3), so retention may purge it.
func ended(o opInfo) bool {
	return o.state == "succeeded" || o.state == "failed" || o.state == "released"
}

// blocks reports whether a hold_until_reconciled operation keeps its key past the TTL: its
// outcome is unknown (in_progress or uncertain). A succeeded one may keep answering its
// duplicates past the TTL or be taken over; both are accepted (protects).
func blocks(o opInfo) bool { return o.hold && (o.state == "in_progress" || o.state == "uncertain") }
func protects(o opInfo) bool {
	return blocks(o) || (o.hold && o.state == "succeeded")
}

// free reports whether the key may have been free at some point up to ret.
func (s keyState) free(ret int64) bool {
	if s.holder == "" {
		return true
	}
	h := s.ops[s.holder]
	if !expiredBy(h, ret) || blocks(h) {
		return false
	}
	// A success keeps its key until its horizon ends, whether or not it is the holder (it may
	// have succeeded after the key was taken over from it).
	for _, o := range s.ops {
		if surelyProtected(o, ret) {
			return false
		}
	}
	return true
}

// protector reports whether operation id, not the holder, may have kept the key at call by
// its horizon: a success the server may name in a 200 or a 422 instead of the holder.
func (s keyState) protector(id string, call int64) (opInfo, bool) {
	o, ok := s.ops[id]
	return o, ok && id != s.holder && mayBeProtected(o, call)
}

// surelyProtected reports whether a success's horizon certainly lasted up to ret;
// mayBeProtected whether it may still have lasted at call.
func surelyProtected(o opInfo, ret int64) bool {
	return o.state == "succeeded" && o.plo > 0 && ret < o.plo-clockSkew
}
func mayBeProtected(o opInfo, call int64) bool {
	return o.state == "succeeded" && o.phi > 0 && call <= o.phi+clockSkew
}

// unheld reports whether the key's hold may have expired (or there is none) by ret, whatever
// its policy: what GET /v1/keys reports as held=false.
func (s keyState) unheld(ret int64) bool {
	return s.holder == "" || expiredBy(s.ops[s.holder], ret)
}

// liveHolder reports whether the key may have been held at some point from call on.
func (s keyState) liveHolder(call int64) bool {
	if s.holder == "" {
		return false
	}
	h := s.ops[s.holder]
	return liveAt(h, call) || protects(h) || mayBeProtected(h, call)
}

// matchesHolder reports whether id names the holder; an admission whose answer was lost has
// an unseen id that a later answer may reveal.
func (s keyState) matchesHolder(id string) bool {
	if s.holder == id {
		return true
	}
	_, known := s.ops[id]
	return unseen(s.holder) && !known
}

// reveal renames an unseen holder to the id an answer revealed.
func (s keyState) reveal(id string) keyState {
	if s.holder == id || !unseen(s.holder) {
		return s
	}
	c := s.clone()
	c.ops[id] = c.ops[s.holder]
	delete(c.ops, s.holder)
	if c.last == s.holder {
		c.last = id
	}
	c.holder = id
	return c
}

// reaperVariants: an in_progress operation past its lease (or its expiry) may already have been
// turned uncertain by the reaper (lease_expired_without_outcome, docs/reference.md §8).
func reaperVariants(s keyState, id string, ret int64) []keyState {
	o, ok := s.ops[id]
	if !ok || o.state != "in_progress" || !lapsedBy(o, ret) {
		return []keyState{s}
	}
	o.state = "uncertain"
	return []keyState{s, s.with(id, o)}
}

func (s keyState) admit(id string, in callInput, exp, lexp int64) keyState {
	c := s.clone()
	if c.holder != "" {
		if h := c.ops[c.holder]; h.state == "in_progress" {
			h.state = "uncertain" // ttl_expired_without_outcome, in the takeover's transaction
			c.ops[c.holder] = h
		}
	}
	c.fencing++
	c.ops[id] = opInfo{state: "in_progress", fp: in.FP, name: in.Name, exp: exp, lexp: lexp, hold: in.Hold,
		fencing: c.fencing}
	c.holder, c.last = id, id
	return c
}

// outcomeTargets are the states a 200 outcome may leave the operation in (docs/reference.md §3), and
// whether a refusal (409) is also possible.
// heldByIt reports whether the operation may still hold the key (if not, a failed outcome with
// release records failed and releases nothing).
func outcomeTargets(o opInfo, in callInput, heldByIt, notHeld bool) (targets []string, mayRefuse bool) {
	if in.Status == o.outcome { // the same outcome again: changes nothing
		targets = append(targets, o.state)
		if in.Status == "failed" && in.Release {
			targets = append(targets, "released")
		}
		return targets, true
	}
	switch o.state {
	case "in_progress", "uncertain":
		switch {
		case in.Status == "failed" && in.Release:
			switch {
			case notHeld:
				targets = []string{"failed"}
			case heldByIt:
				targets = []string{"released", "failed"}
			default:
				targets = []string{"released"}
			}
			return targets, o.state == "uncertain"
		case in.Status == "uncertain":
			// in_progress -> uncertain is permitted; uncertain -> uncertain is not a listed
			// transition, so either answer is accepted.
			return []string{"uncertain"}, o.state == "uncertain"
		default:
			return []string{in.Status}, false
		}
	}
	return nil, true
}

// applyOutcome records that outcome call in (answered at ret) left operation id in state; a
// first success starts the horizon of its operation name (opts.horizon).
func applyOutcome(opts modelOptions, s keyState, id string, in callInput, state string, ret int64) keyState {
	o := s.ops[id]
	if h := opts.horizon[o.name]; state == "succeeded" && o.state != "succeeded" && h > 0 {
		o.plo, o.phi = in.Call+h, ret+h
	}
	o.state, o.outcome = state, in.Status
	c := s.with(id, o)
	if state == "released" && c.holder == id {
		c.holder = ""
	}
	return c
}

// modelOptions relax the model for known, documented server deviations.
type modelOptions struct {
	// tornDuplicate accepts a 200 duplicate whose reported operation state is not the state
	// at the moment the hold was seen (the operation row is read in a later snapshot than the
	// hold, so a concurrent release or outcome shows through). Only the state is relaxed: the
	// duplicate must still name the live holder with the same fingerprint and operation.
	tornDuplicate bool
	// horizon is the horizon of each operation name (nanoseconds) as the run's policies set
	// it (docs/reference.md §2 "Lifecycle"); nil: no policies.
	horizon map[string]int64
	// purges: the run's retention purges ended operations, so an outcome, renew or read of
	// one may find it gone (404), and GET /v1/keys may name no operation.
	purges bool
}

func stepKey(opts modelOptions, s keyState, in callInput, out callOutput) []keyState {
	switch in.Kind {
	case kindAcquire:
		if out.Unknown {
			return []keyState{s, s.admit(fmt.Sprintf("?%d", s.fencing+1), in, 0, 0)}
		}
		if out.Lost {
			// Admitted for certain, at some point before the history's end: the same checks
			// as a 201, except the expiry, which nobody was told.
			if out.Fencing != s.fencing+1 || !s.free(out.Ret) {
				return nil
			}
			if _, dup := s.ops[out.OpID]; dup || out.OpID == "" {
				return nil
			}
			return []keyState{s.admit(out.OpID, in, 0, 0)}
		}
		switch out.Status {
		case 201:
			if out.Fencing != s.fencing+1 || !s.free(out.Ret) {
				return nil
			}
			if _, dup := s.ops[out.OpID]; dup || out.OpID == "" {
				return nil
			}
			return []keyState{s.admit(out.OpID, in, out.Exp, out.LeaseExp)}
		case 200:
			if p, ok := s.protector(out.OpID, in.Call); ok {
				// Answered about a success that protects the key past its holder's TTL.
				if p.fp != in.FP || p.name != in.Name || out.State != "succeeded" {
					return nil
				}
				return []keyState{s}
			}
			if !s.liveHolder(in.Call) || !s.matchesHolder(out.OpID) {
				return nil
			}
			h := s.ops[s.holder]
			if h.fp != in.FP || h.name != in.Name {
				return nil
			}
			if out.State == "uncertain" && h.hold && !opts.tornDuplicate {
				// docs/reference.md §8: under hold_until_reconciled a duplicate of an
				// uncertain operation is 409 outcome_uncertain, never a 200. (Under readmit
				// one its owner reported uncertain is answered 200 as before leases, and
				// one whose lease lapsed 409; the model does not tell the two apart.)
				return nil
			}
			if out.State == "in_progress" && h.lexp > 0 && in.Call > h.lexp+clockSkew {
				// The lease had lapsed before the call: the duplicate path turns the
				// operation uncertain, it cannot still be in progress.
				return nil
			}
			var next []keyState
			for _, v := range reaperVariants(s.reveal(out.OpID), out.OpID, out.Ret) {
				if v.ops[out.OpID].state == out.State || opts.tornDuplicate {
					next = append(next, v)
				}
			}
			return next
		case 409:
			// outcome_uncertain: the key's current operation has an unknown outcome and
			// still protects the key (live hold, or hold_until_reconciled past the TTL).
			if out.Code != "outcome_uncertain" || s.holder == "" || (out.OpID != "" && !s.matchesHolder(out.OpID)) {
				return nil
			}
			if out.OpID != "" {
				s = s.reveal(out.OpID)
			}
			h := s.ops[s.holder]
			if !liveAt(h, in.Call) && !h.hold {
				return nil
			}
			var next []keyState
			for _, v := range reaperVariants(s, s.holder, out.Ret) {
				if v.ops[s.holder].state == "uncertain" {
					next = append(next, v)
				}
			}
			return next
		case 422:
			for id, o := range s.ops {
				if _, ok := s.protector(id, in.Call); ok && (o.fp != in.FP || o.name != in.Name) {
					return []keyState{s} // another request than a protecting success's
				}
			}
			if !s.liveHolder(in.Call) {
				return nil
			}
			if h := s.ops[s.holder]; h.fp == in.FP && h.name == in.Name {
				return nil
			}
			return []keyState{s}
		}
		return nil
	case kindRenew:
		if o, known := s.ops[in.Op]; known && out.Status == 404 && out.Code == "not_found" {
			if opts.purges && ended(o) {
				return []keyState{s} // purged
			}
			return nil
		}
		return stepRenew(s, in, out)
	case kindRelease:
		o, known := s.ops[in.Op]
		if !known {
			return nil
		}
		var next []keyState
		for _, v := range reaperVariants(s, in.Op, out.Ret) {
			o = v.ops[in.Op]
			canRelease := !in.BadToken && v.holder == in.Op && liveAt(o, in.Call) &&
				(o.state == "in_progress" || o.state == "failed")
			released := func() keyState {
				o.state = "released"
				c := v.with(in.Op, o)
				c.holder = ""
				return c
			}
			var ok bool
			switch {
			case out.Unknown:
				next = append(next, v)
				if canRelease {
					next = append(next, released())
				}
				continue
			case out.Status == 200:
				if canRelease {
					next = append(next, released())
				}
				continue
			case out.Status == 409 && out.Code == "not_owner":
				ok = in.BadToken || v.holder != in.Op
			case out.Status == 409 && out.Code == "effect_confirmed":
				ok = !in.BadToken && o.state == "succeeded"
			case out.Status == 409 && out.Code == "outcome_uncertain":
				ok = !in.BadToken && o.state == "uncertain"
			case out.Status == 404 && out.Code == "key_not_held":
				ok = v.unheld(out.Ret)
			}
			if ok {
				next = append(next, v)
			}
		}
		return next
	case kindOutcome:
		if _, known := s.ops[in.Op]; !known {
			return nil
		}
		if out.Status == 404 && out.Code == "not_found" {
			if opts.purges && ended(s.ops[in.Op]) {
				return []keyState{s} // purged
			}
			return nil
		}
		var next []keyState
		for _, v := range reaperVariants(s, in.Op, out.Ret) {
			o := v.ops[in.Op]
			stillHeld := v.holder == in.Op && !expiredBy(o, out.Ret)
			maybeHeld := v.holder == in.Op && liveAt(o, in.Call)
			targets, mayRefuse := outcomeTargets(o, in, maybeHeld && !stillHeld, !maybeHeld)
			switch {
			case out.Unknown:
				next = append(next, v)
				if !in.BadToken {
					for _, t := range targets {
						next = append(next, applyOutcome(opts, v, in.Op, in, t, out.Ret))
					}
				}
			case out.Status == 200:
				if in.BadToken {
					continue
				}
				for _, t := range targets {
					if t == out.State {
						next = append(next, applyOutcome(opts, v, in.Op, in, t, out.Ret))
					}
				}
			case out.Status == 403:
				if in.BadToken {
					next = append(next, v)
				}
			case out.Status == 409 && out.Code == "invalid_transition":
				if !in.BadToken && mayRefuse {
					next = append(next, v)
				}
			}
		}
		return next
	case kindGet:
		if out.Status == 404 {
			if s.fencing == 0 {
				return []keyState{s}
			}
			return nil
		}
		if out.Status != 200 || s.fencing == 0 {
			return nil
		}
		if out.OpID == "" && !out.Held && opts.purges && !unseen(s.last) && ended(s.ops[s.last]) {
			return []keyState{s} // its newest operation was purged
		}
		if out.Held {
			if !s.liveHolder(in.Call) || !s.matchesHolder(out.OpID) {
				return nil
			}
			s = s.reveal(out.OpID)
		} else if !s.unheld(out.Ret) || (s.last != out.OpID && !unseen(s.last)) {
			return nil
		}
		if !unseen(s.last) && s.ops[out.OpID].fencing != out.Fencing {
			return nil
		}
		return []keyState{s}
	}
	return nil
}

// stepRenew: POST /v1/operations/{id}/renew (docs/reference.md §8). Only the owner, only while
// its operation is in_progress, holds the key and its lease has not lapsed; the lease end and
// expires_at then are what the answer says. Every refusal changes nothing, except that a
// lease_expired renew may be the moment the lapsed operation is marked uncertain.
func stepRenew(s keyState, in callInput, out callOutput) []keyState {
	if _, known := s.ops[in.Op]; !known {
		return nil
	}
	var next []keyState
	for _, v := range reaperVariants(s, in.Op, out.Ret) {
		o := v.ops[in.Op]
		canRenew := !in.BadToken && o.state == "in_progress" && v.holder == in.Op && leaseLiveAt(o, in.Call) &&
			liveAt(o, in.Call)
		renewed := func() keyState {
			o.lexp = out.LeaseExp
			if out.Exp != 0 {
				o.exp = out.Exp
			}
			return v.with(in.Op, o)
		}
		switch {
		case out.Unknown:
			next = append(next, v)
			if canRenew {
				// The answer was lost: the lease end is unknown, and with extend_ttl so is
				// the hold's.
				o.lexp = -1
				if in.Extend {
					o.exp = 0
				}
				next = append(next, v.with(in.Op, o))
			}
		case out.Status == 200:
			if canRenew && out.LeaseExp != 0 && (in.Extend || out.LeaseExp <= o.exp+clockSkew || o.exp == 0) {
				next = append(next, renewed())
			}
		case out.Status == 403 && out.Code == "not_owner":
			if in.BadToken {
				next = append(next, v)
			}
		case out.Status == 409 && out.Code == "lease_expired":
			if !in.BadToken && (o.state == "uncertain" || lapsedBy(o, out.Ret) || v.holder != in.Op) {
				next = append(next, v)
			}
		case out.Status == 409 && out.Code == "invalid_transition":
			if !in.BadToken && (o.state != "in_progress" || v.holder != in.Op) {
				next = append(next, v)
			}
		}
	}
	return next
}

func equalKeyState(a, b keyState) bool {
	if a.fencing != b.fencing || a.holder != b.holder || a.last != b.last || len(a.ops) != len(b.ops) {
		return false
	}
	for k, v := range a.ops {
		if w, ok := b.ops[k]; !ok || v != w {
			return false
		}
	}
	return true
}

func describeKeyState(s keyState) string {
	ids := make([]string, 0, len(s.ops))
	for id := range s.ops {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return s.ops[ids[i]].fencing < s.ops[ids[j]].fencing })
	var b strings.Builder
	fmt.Fprintf(&b, "fencing=%d holder=%s", s.fencing, short(s.holder))
	for _, id := range ids {
		fmt.Fprintf(&b, " %d:%s", s.ops[id].fencing, s.ops[id].state)
	}
	return b.String()
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// keyModel is the porcupine model: nondeterministic (reaper, expiry, unknown outcomes) and
// partitioned per key.
func keyModel(opts modelOptions) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range history {
				k := op.Input.(callInput).Key
				if _, ok := byKey[k]; !ok {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() []interface{} { return []interface{}{keyState{ops: map[string]opInfo{}}} },
		Step: func(state, input, output interface{}) []interface{} {
			next := stepKey(opts, state.(keyState), input.(callInput), output.(callOutput))
			out := make([]interface{}, len(next))
			for i, n := range next {
				out[i] = n
			}
			return out
		},
		Equal: func(a, b interface{}) bool { return equalKeyState(a.(keyState), b.(keyState)) },
		Hash: func(state interface{}) uint64 {
			s := state.(keyState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%d|%s|%s|%d", s.fencing, s.holder, s.last, len(s.ops))
			return h.Sum64()
		},
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(callInput), output.(callOutput)
			var req string
			switch in.Kind {
			case kindAcquire:
				req = fmt.Sprintf("acquire(%s/%s ttl=%d lease=%d hold=%v)", in.Name, in.FP, in.TTL, in.Lease, in.Hold)
			case kindRelease:
				req = fmt.Sprintf("release(%s bad=%v)", short(in.Op), in.BadToken)
			case kindOutcome:
				req = fmt.Sprintf("outcome(%s %s rel=%v bad=%v)", short(in.Op), in.Status, in.Release, in.BadToken)
			case kindRenew:
				req = fmt.Sprintf("renew(%s lease=%d extend=%v bad=%v)", short(in.Op), in.Lease, in.Extend, in.BadToken)
			default:
				req = "get"
			}
			if out.Unknown {
				return req + " -> ?"
			}
			if out.Lost {
				return fmt.Sprintf("%s -> lost 201 op=%s f=%d", req, short(out.OpID), out.Fencing)
			}
			return fmt.Sprintf("%s -> %d %s op=%s f=%d state=%s held=%v", req, out.Status, out.Code,
				short(out.OpID), out.Fencing, out.State, out.Held)
		},
		DescribeState: func(state interface{}) string { return describeKeyState(state.(keyState)) },
	}
	return nm.ToModel()
}
