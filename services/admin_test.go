package services

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
)

// adminIsolated runs fn on a fresh, empty PostgreSQL database and a fresh SQLite file: the
// last-admin rule counts every account of the installation, so it cannot be tested on the
// package's shared database where other tests create admins in parallel.
func adminIsolated(t *testing.T, fn func(t *testing.T, a *Accounts, db *models.DB)) {
	t.Helper()
	modeltest.Each(t, modeltest.Fresh(t), func(t *testing.T, db *models.DB) {
		fn(t, NewAccounts(db, slog.New(slog.NewTextHandler(io.Discard, nil)), nil), db)
	})
}

// adminAccount stores an account directly (cheap bcrypt cost) and returns it.
func adminAccount(t *testing.T, db *models.DB, username, role string, tenantID *int64) *OperatorAccount {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("a-long-password"), bcrypt.MinCost)
	require.NoError(t, err)
	op := models.Operator{Username: username, PasswordHash: string(hash), Role: role, TenantID: tenantID, CreatedAt: time.Now().UTC()}
	require.NoError(t, db.Create(&op).Error)
	return &OperatorAccount{ID: op.ID, Username: op.Username, Role: op.Role, TenantID: op.TenantID}
}

// revokeByID revokes API key id as the admin page does.
func revokeByID(a *Accounts, acct *OperatorAccount, id int64) error {
	_, err := a.RevokeAPIKey(context.Background(), acct, APIKeyRef{ID: id})
	return err
}

func adminUnique(t *testing.T) string {
	return "adm-" + strings.ToLower(newSecret("")[:10])
}

func TestAdminAPIKeys(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		admin := adminAccount(t, b.db, adminUnique(t), RoleAdmin, nil)
		tenant := adminUnique(t)

		secret, err := b.accounts.CreateAPIKey(ctx, admin, tenant, "billing worker", "")
		require.NoError(t, err)
		_, err = b.auth.Authenticate(ctx, secret)
		require.NoError(t, err)

		mine := func() []APIKeyInfo {
			all, err := b.accounts.ListAPIKeys(ctx, admin)
			require.NoError(t, err)
			var out []APIKeyInfo
			for _, k := range all {
				if k.Tenant == tenant {
					out = append(out, k)
				}
			}
			return out
		}
		keys := mine()
		require.Len(t, keys, 1)
		k := keys[0]
		require.Equal(t, secret[:12], k.Prefix)
		require.Equal(t, "billing worker", k.Label)
		require.WithinDuration(t, time.Now(), k.CreatedAt, time.Minute)
		require.Nil(t, k.RevokedAt)

		require.NoError(t, revokeByID(b.accounts, admin, k.ID))
		_, err = b.auth.Authenticate(ctx, secret)
		require.ErrorIs(t, err, ErrUnauthorized, "revoked: refused at once by this process")
		require.NotNil(t, mine()[0].RevokedAt)
		require.ErrorIs(t, revokeByID(b.accounts, admin, k.ID), ErrNotFound, "already revoked")
		require.ErrorIs(t, revokeByID(b.accounts, admin, -1), ErrNotFound)

		// Newest first.
		_, err = b.accounts.CreateAPIKey(ctx, admin, tenant, "second", "")
		require.NoError(t, err)
		keys = mine()
		require.Len(t, keys, 2)
		require.Equal(t, "second", keys[0].Label)

		_, err = b.accounts.CreateAPIKey(ctx, admin, "bad tenant name!", "", "")
		require.ErrorIs(t, err, ErrInvalidRequest)
	})
}

func TestAdminRequiresGlobalAdmin(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		tid := b.p.TenantID
		target := adminAccount(t, b.db, adminUnique(t), RoleOperator, nil)
		for _, acct := range []*OperatorAccount{
			nil,
			adminAccount(t, b.db, adminUnique(t), RoleOperator, nil),
			adminAccount(t, b.db, adminUnique(t), RoleAuditor, nil),
			adminAccount(t, b.db, adminUnique(t), RoleAdmin, &tid), // a tenant's admin manages nothing global
		} {
			_, err := b.accounts.ListAPIKeys(ctx, acct)
			require.ErrorIs(t, err, ErrUnauthorized)
			{ // nil, no account, is refused like the rest (the installation is Installation())
				_, err = b.accounts.CreateAPIKey(ctx, acct, adminUnique(t), "", "")
				require.ErrorIs(t, err, ErrUnauthorized)
				require.ErrorIs(t, revokeByID(b.accounts, acct, b.p.APIKeyID), ErrUnauthorized)
				_, err = b.accounts.CreateOperator(ctx, acct, adminUnique(t), "a-long-password", RoleAdmin, "")
				require.ErrorIs(t, err, ErrUnauthorized)
			}
			_, err = b.accounts.ListOperators(ctx, acct)
			require.ErrorIs(t, err, ErrUnauthorized)
			require.ErrorIs(t, b.accounts.SetOperatorRole(ctx, acct, target.ID, RoleAdmin), ErrUnauthorized)
			require.ErrorIs(t, b.accounts.DeleteOperator(ctx, acct, target.ID), ErrUnauthorized)
		}
		got, err := b.auth.Operator(ctx, target.ID)
		require.NoError(t, err)
		require.Equal(t, RoleOperator, got.Role, "nothing changed")
	})
}

func TestAdminOperators(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		ctx := context.Background()
		admin := adminAccount(t, b.db, adminUnique(t), RoleAdmin, nil)
		var tenant models.Tenant
		require.NoError(t, b.db.Where("id = ?", b.p.TenantID).Take(&tenant).Error)

		name := adminUnique(t)
		op, err := b.accounts.CreateOperator(ctx, admin, name, "a-long-password", RoleOperator, tenant.Name)
		require.NoError(t, err)
		find := func() *OperatorInfo {
			all, err := b.accounts.ListOperators(ctx, admin)
			require.NoError(t, err)
			for _, o := range all {
				if o.Username == name {
					return &o
				}
			}
			return nil
		}
		got := find()
		require.NotNil(t, got)
		require.Equal(t, OperatorInfo{ID: op.ID, Username: name, Role: RoleOperator, Tenant: tenant.Name, CreatedAt: got.CreatedAt}, *got)

		_, err = b.accounts.CreateOperator(ctx, admin, adminUnique(t), "short", RoleOperator, "")
		require.ErrorIs(t, err, ErrInvalidRequest)

		require.NoError(t, b.accounts.SetOperatorRole(ctx, admin, op.ID, RoleAuditor))
		require.Equal(t, RoleAuditor, find().Role)
		require.ErrorIs(t, b.accounts.SetOperatorRole(ctx, admin, op.ID, "root"), ErrInvalidRequest)
		require.ErrorIs(t, b.accounts.SetOperatorRole(ctx, admin, -1, RoleAuditor), ErrNotFound)

		require.NoError(t, b.accounts.DeleteOperator(ctx, admin, op.ID))
		require.Nil(t, find())
		_, err = b.auth.Operator(ctx, op.ID)
		require.ErrorIs(t, err, ErrNotFound)
		require.ErrorIs(t, b.accounts.DeleteOperator(ctx, admin, op.ID), ErrNotFound)
	})
}

func TestAdminKeepsLastGlobalAdmin(t *testing.T) {
	t.Parallel()
	adminIsolated(t, func(t *testing.T, a *Accounts, db *models.DB) {
		ctx := context.Background()
		tid := modeltest.Tenant(t, db)
		root := adminAccount(t, db, "root", RoleAdmin, nil)
		// A tenant's admin does not count: it cannot administer the installation.
		tenantAdmin := adminAccount(t, db, "tenant-admin", RoleAdmin, &tid)

		err := a.SetOperatorRole(ctx, root, root.ID, RoleOperator)
		require.ErrorIs(t, err, ErrInvalidRequest)
		require.Contains(t, err.Error(), "last global admin")
		require.ErrorIs(t, a.DeleteOperator(ctx, root, root.ID), ErrInvalidRequest)
		require.NoError(t, a.SetOperatorRole(ctx, root, root.ID, RoleAdmin), "a no-op is fine")
		got, err := NewAuth(db, nil).Operator(ctx, root.ID)
		require.NoError(t, err)
		require.Equal(t, RoleAdmin, got.Role)

		// The tenant's admin can be demoted and deleted freely.
		require.NoError(t, a.SetOperatorRole(ctx, root, tenantAdmin.ID, RoleAuditor))
		require.NoError(t, a.DeleteOperator(ctx, root, tenantAdmin.ID))

		// With a second global admin, either may go, but not both.
		second := adminAccount(t, db, "second", RoleAdmin, nil)
		require.NoError(t, a.SetOperatorRole(ctx, second, root.ID, RoleAuditor))
		require.ErrorIs(t, a.DeleteOperator(ctx, second, second.ID), ErrInvalidRequest)

		// Two admins demoting each other at once: exactly one wins.
		require.NoError(t, a.SetOperatorRole(ctx, second, root.ID, RoleAdmin))
		errs := make(chan error, 2)
		go func() { errs <- a.SetOperatorRole(ctx, root, second.ID, RoleOperator) }()
		go func() { errs <- a.SetOperatorRole(ctx, second, root.ID, RoleOperator) }()
		e1, e2 := <-errs, <-errs
		require.True(t, (e1 == nil) != (e2 == nil), "one demotion must be refused: %v, %v", e1, e2)
		var admins int64
		require.NoError(t, db.Model(&models.Operator{}).Where("role = ? AND tenant_id IS NULL", RoleAdmin).Count(&admins).Error)
		require.EqualValues(t, 1, admins)
	})
}
