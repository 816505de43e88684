package services

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
)

// TestPolicyValidation: every field of a policy is checked, all problems at once, and a
// policy for a tenant that does not exist is refused rather than creating one.
func TestPolicyValidation(t *testing.T) {
	d := func(s string) *time.Duration { v, err := time.ParseDuration(s); require.NoError(t, err); return &v }
	eachDB(t, func(t *testing.T, b *testBundle) {
		ps := NewPolicies(b.db, nil)
		tenant := b.tenantName(t)
		for _, c := range []struct {
			name   string
			in     PolicyInput
			fields []string
		}{
			{"nothing set", PolicyInput{Tenant: tenant}, []string{"policy"}},
			{"unknown tenant", PolicyInput{Tenant: tenant + "-typo", TTL: d("1h")}, []string{"tenant"}},
			{"bad operation name", PolicyInput{Tenant: tenant, Operation: "charge card", TTL: d("1h")}, []string{"operation"}},
			{"ttl under a second", PolicyInput{Tenant: tenant, TTL: d("500ms")}, []string{"ttl"}},
			{"ttl not whole seconds", PolicyInput{Tenant: tenant, TTL: d("1500ms")}, []string{"ttl"}},
			{"ttl too long", PolicyInput{Tenant: tenant, TTL: d("600000h")}, []string{"ttl"}},
			{"lease longer than ttl", PolicyInput{Tenant: tenant, TTL: d("1m"), Lease: d("2m")}, []string{"lease"}},
			{"bad on_expiry", PolicyInput{Tenant: tenant, OnExpiry: ptr("never")}, []string{"on_expiry"}},
			{"several", PolicyInput{Tenant: tenant, Operation: "a b", TTL: d("0s"), OnExpiry: ptr("x")}, []string{"operation", "ttl", "on_expiry"}},
		} {
			_, err := ps.Set(bg, Installation(), c.in)
			var de *Error
			require.True(t, errors.As(err, &de), "%s: %v", c.name, err)
			require.Equal(t, CodeInvalidRequest, de.Code, c.name)
			var got []string
			for _, f := range de.Fields {
				got = append(got, f.Field)
			}
			require.Equal(t, c.fields, got, c.name)
		}
		hour := time.Hour
		tenantAdmin := &OperatorAccount{Username: "t-admin", Role: RoleAdmin, TenantID: &b.p.TenantID}
		for _, by := range []*OperatorAccount{nil, {Username: "op", Role: RoleOperator}, tenantAdmin} {
			_, err := ps.Set(bg, by, PolicyInput{Tenant: tenant, TTL: &hour})
			var de *Error
			require.True(t, errors.As(err, &de), "%v", err)
			require.Equal(t, CodeUnauthorized, de.Code, "only a global admin (or the installation) sets a policy")
			require.Equal(t, CodeUnauthorized, ps.Delete(bg, by, tenant, "").(*Error).Code)
		}
		list, err := ps.List(bg, tenant)
		require.NoError(t, err)
		require.Empty(t, list, "nothing was stored")
	})
}

// TestPoliciesApplyAtAdmission: an acquire takes each field it leaves out from the most
// specific policy that sets it (the operation's, then the tenant's, then the default), alone
// and in a batch; what it sends wins; a policy's lease is cut to the request's TTL; without a
// TTL from anywhere ttl_seconds is required; set and delete apply to the instance's next
// acquire.
func TestPoliciesApplyAtAdmission(t *testing.T) {
	hour, minute, week := time.Hour, time.Minute, 7*24*time.Hour
	eachDB(t, func(t *testing.T, b *testBundle) {
		ps := NewPolicies(b.db, nil)
		adm := b.adm.WithPolicies(ps)
		tenant := b.tenantName(t)

		_, err := adm.Acquire(bg, b.p, AcquireInput{Key: "no-ttl"})
		requireFieldError(t, err, "ttl_seconds")

		_, err = ps.Set(bg, Installation(), PolicyInput{Tenant: tenant, TTL: &hour, OnExpiry: ptr(OnExpiryHold)})
		require.NoError(t, err)
		_, err = ps.Set(bg, Installation(), PolicyInput{Tenant: tenant, Operation: "charge", TTL: &week, Lease: &minute})
		require.NoError(t, err)

		pf, err := ps.InForce(bg, b.p.TenantID, ptr("charge"))
		require.NoError(t, err)
		require.Equal(t, PolicyInForce{TTL: week, TTLFrom: PolicySourceOperation, Lease: minute, LeaseFrom: PolicySourceOperation,
			OnExpiry: OnExpiryHold, OnExpiryFrom: PolicySourceTenant, Retention: DefaultRetention,
			RetentionFrom: PolicySourceDefault, HorizonFrom: PolicySourceDefault}, pf)
		pf, err = ps.InForce(bg, b.p.TenantID, ptr("refund"))
		require.NoError(t, err)
		require.Equal(t, PolicyInForce{TTL: hour, TTLFrom: PolicySourceTenant, Lease: hour, LeaseFrom: PolicySourceDefault,
			OnExpiry: OnExpiryHold, OnExpiryFrom: PolicySourceTenant, Retention: DefaultRetention,
			RetentionFrom: PolicySourceDefault, HorizonFrom: PolicySourceDefault}, pf)

		span := func(acq *Acquisition) (ttl, lease time.Duration) {
			op := opRow(t, b, acq.OperationID)
			return op.ExpiresAt.Sub(op.AcquiredAt), op.LeaseEnd().Sub(op.AcquiredAt)
		}
		acq, err := adm.Acquire(bg, b.p, AcquireInput{Key: "charge-1", Operation: ptr("charge")})
		require.NoError(t, err)
		ttl, lease := span(acq)
		require.Equal(t, [2]time.Duration{week, minute}, [2]time.Duration{ttl, lease})
		require.Equal(t, OnExpiryHold, acq.OnExpiry)

		acq, err = adm.Acquire(bg, b.p, AcquireInput{Key: "refund-1", Operation: ptr("refund")})
		require.NoError(t, err)
		ttl, lease = span(acq)
		require.Equal(t, [2]time.Duration{hour, hour}, [2]time.Duration{ttl, lease}, "the lease defaults to the TTL")

		acq, err = adm.Acquire(bg, b.p, AcquireInput{Key: "charge-2", Operation: ptr("charge"), TTLSeconds: 30,
			OnExpiry: ptr(OnExpiryReadmit)})
		require.NoError(t, err)
		ttl, lease = span(acq)
		require.Equal(t, [2]time.Duration{30 * time.Second, 30 * time.Second}, [2]time.Duration{ttl, lease},
			"what the request sends wins, and the policy's lease is cut to its TTL")
		require.Equal(t, OnExpiryReadmit, acq.OnExpiry)

		items, err := adm.AcquireBatch(bg, b.p, []AcquireInput{{Key: "batch-1", Operation: ptr("charge")}, {Key: "batch-2"}})
		require.NoError(t, err)
		for i, want := range []time.Duration{week, hour} {
			require.NoError(t, items[i].Err)
			ttl, _ = span(items[i].Acquisition)
			require.Equal(t, want, ttl, "batch item %d", i)
		}

		require.NoError(t, ps.Delete(bg, Installation(), tenant, ""))
		err = ps.Delete(bg, Installation(), tenant, "")
		var de *Error
		require.True(t, errors.As(err, &de))
		require.Equal(t, CodeNotFound, de.Code)
		_, err = adm.Acquire(bg, b.p, AcquireInput{Key: "refund-2", Operation: ptr("refund")})
		requireFieldError(t, err, "ttl_seconds")
		acq, err = adm.Acquire(bg, b.p, AcquireInput{Key: "charge-3", Operation: ptr("charge")})
		require.NoError(t, err, "the operation's policy still gives a TTL")
		require.Equal(t, OnExpiryReadmit, acq.OnExpiry, "on_expiry came from the deleted tenant-wide policy")

		// The operations admitted here with a one-minute lease end now: left in progress, their
		// leases would lapse during a later test and the reaper there would count them.
		var open []models.Operation
		require.NoError(t, b.db.Where("tenant_id = ? AND state = ?", b.p.TenantID, StateInProgress).Find(&open).Error)
		for _, o := range open {
			require.NoError(t, b.db.Model(&models.Operation{}).Where("id = ?", o.ID).
				Updates(map[string]any{"lease_expires_at": o.ExpiresAt}).Error)
		}

		// A policy's TTL above the maximum (IDEMGATE_MAX_TTL, 30 days by default) is what an
		// acquire gets cut to, and InForce says the same.
		long := 40 * 24 * time.Hour
		_, err = ps.Set(bg, Installation(), PolicyInput{Tenant: tenant, Operation: "archive", TTL: &long})
		require.NoError(t, err)
		pf, err = ps.InForce(bg, b.p.TenantID, ptr("archive"))
		require.NoError(t, err)
		require.Equal(t, DefaultMaxTTL, pf.TTL)
		require.Equal(t, DefaultMaxTTL, pf.Lease)
		acq, err = adm.Acquire(bg, b.p, AcquireInput{Key: "archive-1", Operation: ptr("archive")})
		require.NoError(t, err)
		require.Equal(t, int64(DefaultMaxTTL/time.Second), acq.TTLSeconds)
		_, err = adm.Release(bg, b.p, ReleaseInput{Key: "archive-1", OwnerToken: acq.OwnerToken})
		require.NoError(t, err)

		// Another instance, which has read nothing yet, sees the policies as they are.
		other, err := NewPolicies(b.db, nil).InForce(bg, b.p.TenantID, ptr("charge"))
		require.NoError(t, err)
		require.Equal(t, week, other.TTL)

		list, err := ps.List(bg, tenant)
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Equal(t, "archive", list[0].Operation, "by operation name")
		require.Equal(t, "charge", list[1].Operation)
		require.Equal(t, "cli", list[1].UpdatedBy, "the installation is the command line")
	})
}

// requireFieldError requires err to be ErrInvalidRequest naming field.
func requireFieldError(t *testing.T, err error, field string) {
	t.Helper()
	var de *Error
	require.True(t, errors.As(err, &de), "%v", err)
	require.Equal(t, CodeInvalidRequest, de.Code)
	for _, f := range de.Fields {
		if f.Field == field {
			return
		}
	}
	t.Fatalf("no field %q in %+v", field, de.Fields)
}

// FuzzPolicyInput: validation never panics, and a policy it accepts sets something, in whole
// seconds within the acquire's range, with a lease no longer than its TTL.
func FuzzPolicyInput(f *testing.F) {
	f.Add("shop", "charge", int64(3600e9), int64(60e9), "readmit", true, true, true)
	f.Add("shop", "", int64(1e9), int64(2e9), "hold_until_reconciled", true, true, true)
	f.Add("", "a b", int64(-1), int64(0), "", false, false, false)
	f.Fuzz(func(t *testing.T, tenant, op string, ttl, lease int64, onExpiry string, hasTTL, hasLease, hasOnExpiry bool) {
		in := PolicyInput{Tenant: tenant, Operation: op}
		if hasTTL {
			d := time.Duration(ttl)
			in.TTL = &d
		}
		if hasLease {
			d := time.Duration(lease)
			in.Lease = &d
		}
		if hasOnExpiry {
			in.OnExpiry = &onExpiry
		}
		if in.validate() != nil {
			return
		}
		require.True(t, in.TTL != nil || in.Lease != nil || in.OnExpiry != nil)
		for _, d := range []*time.Duration{in.TTL, in.Lease} {
			if d != nil {
				require.True(t, *d >= time.Second && *d%time.Second == 0 && *d/time.Second <= MaxTTLSeconds)
			}
		}
		if in.TTL != nil && in.Lease != nil {
			require.LessOrEqual(t, *in.Lease, *in.TTL)
		}
		require.Empty(t, ValidateTenantName(tenant))
	})
}

// TestConcurrentPolicySets: admins setting one policy at once all succeed, and one of their
// policies is the one stored (no unique-index failure answered as an internal error).
func TestConcurrentPolicySets(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		ps := NewPolicies(b.db, nil)
		tenant := b.tenantName(t)
		var wg sync.WaitGroup
		errs := make([]error, 16)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := time.Duration(i+1) * time.Minute
				_, errs[i] = ps.Set(bg, Installation(), PolicyInput{Tenant: tenant, Operation: "race", TTL: &d})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "set %d", i)
		}
		list, err := ps.List(bg, tenant)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.NotNil(t, list[0].TTL)
	})
}
