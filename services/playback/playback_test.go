package playback

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
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
	// Another account's playback left at step 4 (its operation uncertain): it must not show
	// in this playback's lists. Before each playback had a tenant of its own, it did.
	carol := &services.OperatorAccount{ID: 3, Username: "carol", Role: services.RoleOperator}
	if _, err := p.Play(ctx, carol, uuid.NewString(), 4); err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	if _, err := p.Play(ctx, alice, id, 1); err != nil {
		t.Fatal(err)
	}
	pb, err := p.Play(ctx, alice, id, Steps)
	if err != nil {
		t.Fatal(err)
	}
	if len(pb.Steps) != Steps || pb.Restarted || !strings.HasPrefix(pb.Tenant, TenantPrefix) {
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
	if len(queue.Queue) != 1 || queue.Queue[0].ID != a1.OperationID {
		t.Fatalf("step 4: want only operation %s in the uncertain list, got %+v", a1.OperationID, queue.Queue)
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
	if other.Tenant == pb.Tenant {
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
// real time plays again from step 1 in a new tenant, instead of showing a fresh admission as if
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
	if !pb.Restarted || pb.Tenant == first.Tenant || len(pb.Steps) != 2 {
		t.Fatalf("restarted %v, tenant %s (was %s), %d steps", pb.Restarted, pb.Tenant, first.Tenant, len(pb.Steps))
	}
	if d := pb.Steps[1].Exchanges[0].Acquisition; d == nil || d.Admitted {
		t.Fatalf("step 2 after the restart: %+v", d)
	}
	// Steps 6 and 7 need attempt 2's hold: asked for long after step 5, they start again too.
	if pb, err = p.Play(ctx, alice, id, 5); err != nil {
		t.Fatal(err)
	}
	tenant := pb.Tenant
	now = now.Add(TTL)
	if pb, err = p.Play(ctx, alice, id, 7); err != nil {
		t.Fatal(err)
	}
	if !pb.Restarted || pb.Tenant == tenant || len(pb.Steps) != 7 || pb.Steps[6].Exchanges[0].Code() != services.CodeNotOwner {
		t.Fatalf("restarted %v, tenant %s (was %s), %d steps", pb.Restarted, pb.Tenant, tenant, len(pb.Steps))
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
	if _, err := os.Stat(filepath.Join(dir, pidFile)); err != nil {
		t.Fatalf("no pid file: %v", err)
	}
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

// TestPlaybackSurvivesAStoreFailure: a call that fails in the sandbox's store is not recorded
// as the step's answer. Before, a store_unavailable answer (here: another connection holds
// the sandbox's write lock past its timeout) was recorded like step 3's 422, and every later
// step answered wrongly (201 for the duplicate, 404 for the reconciliation) until Reset. Now
// the error is returned and the next call plays the playback from step 1.
func TestPlaybackSurvivesAStoreFailure(t *testing.T) {
	defer func(d time.Duration) { storeTimeout = d }(storeTimeout)
	storeTimeout = 200 * time.Millisecond
	p := newPlayer(t)
	ctx := context.Background()
	id := uuid.NewString()
	if _, err := p.Play(ctx, alice, id, 2); err != nil {
		t.Fatal(err)
	}
	locker, err := models.Open(ctx, models.OpenOptions{SQLitePath: filepath.Join(p.sandbox.sb.dir, "sandbox.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	conn, err := locker.DB.DB()
	if err != nil {
		t.Fatal(err)
	}
	c, err := conn.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	_, err = p.Play(ctx, alice, id, 3)
	if _, rerr := c.ExecContext(ctx, "ROLLBACK"); rerr != nil {
		t.Fatal(rerr)
	}
	_ = c.Close()
	if err == nil || refusal(err) {
		t.Fatalf("step 3 in a locked store: %v", err)
	}
	pb, err := p.Play(ctx, alice, id, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !pb.Restarted || len(pb.Steps) != 3 || pb.Steps[2].Exchanges[0].Code() != services.CodeFingerprintMismatch {
		t.Fatalf("after the failure: restarted %v, %d steps, %+v", pb.Restarted, len(pb.Steps), pb.Steps)
	}
	if d := pb.Steps[1].Exchanges[0].Acquisition; d == nil || d.Admitted {
		t.Fatalf("step 2 after the failure: %+v", d)
	}
}

// TestBrokenSandboxIsReplaced: a sandbox whose store fails (closed here; a deleted or
// corrupted file behaves alike) is replaced by a fresh one, so Explore heals without a
// restart of the server, and the broken one is removed.
func TestBrokenSandboxIsReplaced(t *testing.T) {
	p := newPlayer(t)
	ctx := context.Background()
	id := uuid.NewString()
	if _, err := p.Play(ctx, alice, id, 1); err != nil {
		t.Fatal(err)
	}
	broken := p.sandbox.sb
	if err := broken.db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Play(ctx, alice, id, 2); err == nil {
		t.Fatal("a closed store played step 2")
	}
	pb, err := p.Play(ctx, alice, id, 2)
	if err != nil {
		t.Fatal(err)
	}
	if p.sandbox.sb == broken || !pb.Restarted || pb.Steps[1].Exchanges[0].Acquisition.Admitted {
		t.Fatalf("not replaced: restarted %v, %+v", pb.Restarted, pb.Steps)
	}
	waitGone(t, broken.dir)
}

func waitGone(t *testing.T, dir string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the retired sandbox %s was not removed", dir)
}

// TestSandboxIsReplacedWhenFull: a sandbox takes maxTenantsPerSandbox playbacks, then a new
// one is opened and the old one removed, so playbacks left before step 8 (their uncertain
// operations are never purged) cannot grow the file without end. A playback of the old
// sandbox asked for again starts over in the new one.
func TestSandboxIsReplacedWhenFull(t *testing.T) {
	p := newPlayer(t)
	ctx := context.Background()
	old, err := p.Play(ctx, alice, uuid.NewString(), 1)
	if err != nil {
		t.Fatal(err)
	}
	first := p.sandbox.sb
	first.tenants.Store(maxTenantsPerSandbox)
	if _, err := p.Play(ctx, alice, uuid.NewString(), 1); err != nil {
		t.Fatal(err)
	}
	if p.sandbox.sb == first || p.sandbox.sb.tenants.Load() != 1 {
		t.Fatal("a full sandbox took another playback")
	}
	waitGone(t, first.dir)
	again, err := p.Play(ctx, alice, old.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Restarted || len(again.Steps) != 2 || again.Steps[1].Exchanges[0].Acquisition.Admitted {
		t.Fatalf("the old sandbox's playback: restarted %v, %+v", again.Restarted, again.Steps)
	}
}

// TestPlaybacksOfOneAccountCannotPushOutOthers: an account starting many playbacks forgets
// only its own oldest ones.
func TestPlaybacksOfOneAccountCannotPushOutOthers(t *testing.T) {
	p := newPlayer(t)
	ctx := context.Background()
	bob := &services.OperatorAccount{ID: 2, Username: "bob", Role: services.RoleOperator}
	kept := uuid.NewString()
	if _, err := p.Play(ctx, bob, kept, 1); err != nil {
		t.Fatal(err)
	}
	var firstOfAlice string
	for i := range maxRuns + 10 {
		id := uuid.NewString()
		if i == 0 {
			firstOfAlice = id
		}
		if _, err := p.Play(ctx, alice, id, 0); err != nil {
			t.Fatal(err)
		}
	}
	if pb, err := p.Play(ctx, bob, kept, 2); err != nil || pb.Restarted {
		t.Fatalf("bob's playback was forgotten: %v", err)
	}
	if pb, err := p.Play(ctx, alice, firstOfAlice, 2); err != nil || !pb.Restarted {
		t.Fatalf("alice's oldest playback was kept beyond %d: %v", maxRunsPerAccount, err)
	}
}

// TestStaleSandboxesAreRemoved: the sandbox directory of a server killed with SIGKILL (its
// process gone) is removed when a sandbox is next opened; one of a running process, or
// without a pid, is left alone.
func TestStaleSandboxesAreRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(tmp, dirPrefix+"stale")
	live := filepath.Join(tmp, dirPrefix+"live")
	young := filepath.Join(tmp, dirPrefix+"young")
	for dir, pid := range map[string]string{stale: strconv.Itoa(cmd.Process.Pid), live: strconv.Itoa(os.Getppid()), young: ""} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if pid != "" {
			if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(pid), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := newPlayer(t)
	if _, err := p.Play(context.Background(), alice, uuid.NewString(), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dead server's sandbox is still there: %v", err)
	}
	for _, dir := range []string{live, young} {
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("%s was removed: %v", dir, err)
		}
	}
	if !strings.HasPrefix(p.sandbox.sb.dir, tmp) {
		t.Fatalf("sandbox %s is not under TMPDIR %s", p.sandbox.sb.dir, tmp)
	}
}
