package playback

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/services"
)

var alice = &services.OperatorAccount{ID: 1, Username: "alice", Role: services.RoleAuditor}

func newPlayer(t *testing.T) *Player {
	t.Helper()
	p := New(nil)
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p
}

// TestPlaybackTellsTheContract plays the eight steps and checks each answer is the one
// docs/reference.md gives for it: the playback teaches the contract, so a change of behaviour
// that makes it teach something else fails here.
func TestPlaybackTellsTheContract(t *testing.T) {
	p := newPlayer(t)
	ctx := context.Background()
	id := uuid.NewString()
	if _, err := p.Play(ctx, alice, id, 1); err != nil {
		t.Fatal(err)
	}
	pb, err := p.Play(ctx, alice, id, Steps)
	if err != nil {
		t.Fatal(err)
	}
	if len(pb.Steps) != Steps || pb.Restarted || pb.Tenant != SandboxTenant {
		t.Fatalf("played %d steps, restarted %v, tenant %q", len(pb.Steps), pb.Restarted, pb.Tenant)
	}
	step := func(n int) []Exchange { return pb.Steps[n-1].Exchanges }

	a1 := step(1)[0].Acquisition
	if a1 == nil || !a1.Admitted || a1.FencingToken != 1 || a1.OwnerToken == "" || a1.Key != pb.Key {
		t.Fatalf("step 1: %+v, %v", a1, step(1)[0].Err)
	}
	if d := step(2)[0].Acquisition; d == nil || d.Admitted || d.Operation == nil || d.Operation.ID != a1.OperationID {
		t.Fatalf("step 2: want a duplicate naming %s, got %+v, %v", a1.OperationID, d, step(2)[0].Err)
	}
	if c := step(3)[0].Code(); c != services.CodeFingerprintMismatch {
		t.Fatalf("step 3: code %q, want fingerprint_mismatch", c)
	}
	clock, queue := step(4)[0], step(4)[1]
	if clock.Err != nil || clock.Reaped.MarkedUncertain < 1 || clock.Elapsed != TTL {
		t.Fatalf("step 4 clock: %+v", clock)
	}
	if !queued(queue.Queue, a1.OperationID) {
		t.Fatalf("step 4: operation %s not in the uncertain list %+v", a1.OperationID, queue.Queue)
	}
	a2 := step(5)[0].Acquisition
	if a2 == nil || !a2.Admitted || a2.FencingToken != 2 || a2.PreviousOperation == nil ||
		a2.PreviousOperation.ID != a1.OperationID || a2.PreviousOperation.State != services.StateUncertain {
		t.Fatalf("step 5: want admission 2 warning of %s, got %+v, %v", a1.OperationID, a2, step(5)[0].Err)
	}
	if o := step(6)[0].Operation; o == nil || o.State != services.StateSucceeded {
		t.Fatalf("step 6 outcome: %+v, %v", o, step(6)[0].Err)
	}
	if d := step(6)[1].Acquisition; d == nil || d.Admitted || d.Operation.Outcome == nil || d.Operation.Outcome.Receipt == nil ||
		*d.Operation.Outcome.Receipt != receipt {
		t.Fatalf("step 6: a duplicate should get the stored outcome, got %+v", d)
	}
	if c := step(7)[0].Code(); c != services.CodeNotOwner {
		t.Fatalf("step 7: code %q, want not_owner", c)
	}
	if tl := pb.Steps[6].Timeline; len(tl) != 2 || tl[0].State != services.StateUncertain || tl[1].State != services.StateSucceeded {
		t.Fatalf("step 7 changed the key: %+v", tl)
	}
	rec := step(8)
	// alice is an auditor, who could not record an outcome: an operator of the sandbox does.
	if rec[0].Err != nil || rec[0].Operation.State != services.StateFailed || rec[0].Operation.Outcome.RecordedBy != SandboxOperator {
		t.Fatalf("step 8: %+v, %v", rec[0].Operation, rec[0].Err)
	}
	if rec[1].Detail == nil || rec[1].Detail.State != services.StateFailed || len(rec[2].Queue) != 0 {
		t.Fatalf("step 8: operation %+v, queue %+v", rec[1].Detail, rec[2].Queue)
	}
	// Every step's timeline shows the key as it stood after that step.
	want := [][]string{{"in_progress"}, {"in_progress"}, {"in_progress"}, {"uncertain"}, {"uncertain", "in_progress"},
		{"uncertain", "succeeded"}, {"uncertain", "succeeded"}, {"failed", "succeeded"}}
	for i, st := range pb.Steps {
		var got []string
		for _, o := range st.Timeline {
			got = append(got, o.State)
		}
		if len(got) != len(want[i]) || (len(got) > 0 && (got[0] != want[i][0] || got[len(got)-1] != want[i][len(want[i])-1])) {
			t.Errorf("step %d timeline %v, want %v", i+1, got, want[i])
		}
	}
}

func queued(q []services.QueuedOperation, id string) bool {
	for _, o := range q {
		if o.ID == id {
			return true
		}
	}
	return false
}

// TestPlaybackStepsPlayOnce: a reload, a second tab and Back ask for steps already played;
// they are shown as recorded and never played again (a second acquire at step 1 would be a
// duplicate, a second outcome at step 6 refused).
func TestPlaybackStepsPlayOnce(t *testing.T) {
	p := newPlayer(t)
	ctx := context.Background()
	id := uuid.NewString()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n <= Steps; n++ {
				if _, err := p.Play(ctx, alice, id, n); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	pb, err := p.Play(ctx, alice, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(pb.Steps) != Steps || pb.Restarted {
		t.Fatalf("%d steps, restarted %v", len(pb.Steps), pb.Restarted)
	}
	for _, st := range pb.Steps {
		for _, ex := range st.Exchanges {
			if st.N != 3 && st.N != 7 && ex.Err != nil {
				t.Errorf("step %d played twice or failed: %v", st.N, ex.Err)
			}
		}
	}
	// Another account never sees this playback: the same id is a new playback for it.
	bob := &services.OperatorAccount{ID: 2, Username: "bob", Role: services.RoleAdmin}
	other, err := p.Play(ctx, bob, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if other.Key == pb.Key {
		t.Fatal("bob was shown alice's playback")
	}
	// bob, an admin, may act: step 8 is recorded under his name.
	if other, err = p.Play(ctx, bob, id, Steps); err != nil {
		t.Fatal(err)
	}
	if by := other.Steps[7].Exchanges[0].Operation.Outcome.RecordedBy; by != "bob" {
		t.Fatalf("bob's reconciliation recorded by %q", by)
	}
}

// TestPlaybackRestartsAStaleHold: step 2 asked for after the first hold could have run out in
// real time plays again from step 1 on a new key, instead of showing a fresh admission as if
// it were the duplicate.
func TestPlaybackRestartsAStaleHold(t *testing.T) {
	p := newPlayer(t)
	now := time.Now()
	p.now = func() time.Time { return now }
	ctx := context.Background()
	id := uuid.NewString()
	first, err := p.Play(ctx, alice, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(TTL)
	pb, err := p.Play(ctx, alice, id, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !pb.Restarted || pb.Key == first.Key || len(pb.Steps) != 2 {
		t.Fatalf("restarted %v, key %s (was %s), %d steps", pb.Restarted, pb.Key, first.Key, len(pb.Steps))
	}
	if d := pb.Steps[1].Exchanges[0].Acquisition; d == nil || d.Admitted {
		t.Fatalf("step 2 after the restart: %+v", d)
	}
	// Steps 6 and 7 need attempt 2's hold: asked for long after step 5, they start again too.
	if pb, err = p.Play(ctx, alice, id, 5); err != nil {
		t.Fatal(err)
	}
	key := pb.Key
	now = now.Add(TTL)
	if pb, err = p.Play(ctx, alice, id, 7); err != nil {
		t.Fatal(err)
	}
	if !pb.Restarted || pb.Key == key || len(pb.Steps) != 7 || pb.Steps[6].Exchanges[0].Code() != services.CodeNotOwner {
		t.Fatalf("restarted %v, key %s (was %s), %d steps", pb.Restarted, pb.Key, key, len(pb.Steps))
	}

	// A playback this process never played, asked for at step 5 (another instance's, or one
	// from before a restart), is played from step 1 and says so.
	far, err := p.Play(ctx, alice, uuid.NewString(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if !far.Restarted || len(far.Steps) != 5 || far.Steps[4].Exchanges[0].Acquisition.FencingToken != 2 {
		t.Fatalf("restarted %v, %d steps", far.Restarted, len(far.Steps))
	}
}

// TestPlayerCloseRemovesTheSandbox: the sandbox is a temporary store of this process; Close
// removes it, and a closed Player refuses to play.
func TestPlayerCloseRemovesTheSandbox(t *testing.T) {
	p := New(nil)
	if _, err := p.Play(context.Background(), alice, uuid.NewString(), 1); err != nil {
		t.Fatal(err)
	}
	dir := p.sandbox.sb.dir
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("sandbox directory %s still there: %v", dir, err)
	}
	if _, err := p.Play(context.Background(), alice, uuid.NewString(), 1); err != ErrClosed {
		t.Fatalf("closed player: %v", err)
	}
}
