package services

import (
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAccountAdministrationNeedsAGlobalAdmin: the command line's account methods refuse
// anyone but a global admin, like the admin page's.
func TestAccountAdministrationNeedsAGlobalAdmin(t *testing.T) {
	t.Parallel()
	modeltest.Each(t, modeltest.Fresh(t), func(t *testing.T, db *models.DB) {
		accounts := NewAccounts(db, nil, nil)
		_, err := accounts.CreateAPIKey(bg, Installation(), "shop", "", "")
		require.NoError(t, err)
		shop := tenantID(t, db, "shop")
		for _, acct := range []*OperatorAccount{nil, {Role: RoleOperator}, {Role: RoleAdmin, TenantID: &shop}} {
			_, err := accounts.ListTenants(bg, acct)
			require.ErrorIs(t, err, ErrUnauthorized)
			_, err = accounts.OperatorByUsername(bg, acct, "x")
			require.ErrorIs(t, err, ErrUnauthorized)
			require.ErrorIs(t, accounts.SetOperatorPassword(bg, acct, 1, "a-long-enough-password"), ErrUnauthorized)
		}
	})
}

// TestSetOperatorPasswordConcurrently: concurrent password changes of one account leave it
// with exactly one of them, and the old password stops working.
func TestSetOperatorPasswordConcurrently(t *testing.T) {
	t.Parallel()
	admin := &OperatorAccount{Username: "test", Role: RoleAdmin}
	modeltest.Each(t, modeltest.Fresh(t), func(t *testing.T, db *models.DB) {
		auth := NewAuth(db, nil)
		accounts := NewAccounts(db, nil, auth)
		op, err := accounts.CreateOperator(bg, Installation(), "carol", "the-old-password", RoleOperator, "")
		require.NoError(t, err)
		got, err := accounts.OperatorByUsername(bg, admin, "carol")
		require.NoError(t, err)
		require.Equal(t, op.ID, got.ID)
		_, err = accounts.OperatorByUsername(bg, admin, "nobody")
		require.ErrorIs(t, err, ErrNotFound)
		require.ErrorIs(t, accounts.SetOperatorPassword(bg, admin, op.ID, "short"), ErrInvalidRequest)
		require.ErrorIs(t, accounts.SetOperatorPassword(bg, admin, op.ID+1000, "a-long-enough-password"), ErrNotFound)

		passwords := []string{"new-password-one", "new-password-two", "new-password-three", "new-password-four"}
		var wg sync.WaitGroup
		for _, pw := range passwords {
			wg.Go(func() { assert.NoError(t, accounts.SetOperatorPassword(bg, admin, op.ID, pw)) })
		}
		wg.Wait()
		works := 0
		for _, pw := range passwords {
			if _, err := auth.Login(bg, "carol", pw); err == nil {
				works++
			}
		}
		require.Equal(t, 1, works)
		_, err = auth.Login(bg, "carol", "the-old-password")
		require.ErrorIs(t, err, ErrUnauthorized)
	})
}

// TestListTenantsCountsKeys: each tenant with its keys, revoked ones counted apart.
func TestListTenantsCountsKeys(t *testing.T) {
	t.Parallel()
	admin := &OperatorAccount{Username: "test", Role: RoleAdmin}
	modeltest.Each(t, modeltest.Fresh(t), func(t *testing.T, db *models.DB) {
		accounts := NewAccounts(db, nil, nil)
		s1, err := accounts.CreateAPIKey(bg, Installation(), "b-tenant", "", "")
		require.NoError(t, err)
		_, err = accounts.CreateAPIKey(bg, Installation(), "b-tenant", "", "")
		require.NoError(t, err)
		_, err = accounts.CreateAPIKey(bg, Installation(), "a-tenant", "", "")
		require.NoError(t, err)
		_, err = accounts.RevokeAPIKey(bg, Installation(), APIKeyRef{Key: s1})
		require.NoError(t, err)
		ts, err := accounts.ListTenants(bg, admin)
		require.NoError(t, err)
		require.Len(t, ts, 2)
		require.Equal(t, "a-tenant", ts[0].Name)
		require.EqualValues(t, 1, ts[0].APIKeys)
		require.EqualValues(t, 1, ts[0].ActiveKeys)
		require.Equal(t, "b-tenant", ts[1].Name)
		require.EqualValues(t, 2, ts[1].APIKeys)
		require.EqualValues(t, 1, ts[1].ActiveKeys)
		require.False(t, ts[1].CreatedAt.IsZero())
	})
}

// FuzzValidatePassword: what ValidatePassword accepts, bcrypt can hash whole (at most 72
// bytes) and is at least MinPasswordChars characters.
func FuzzValidatePassword(f *testing.F) {
	for _, s := range []string{"", "short", "exactly-12ch", strings.Repeat("x", 72), strings.Repeat("x", 73), strings.Repeat("é", 12), strings.Repeat("é", 37)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidatePassword(s) == "" && (len(s) > 72 || utf8.RuneCountInString(s) < MinPasswordChars) {
			t.Fatalf("ValidatePassword accepted %q", s)
		}
	})
}
