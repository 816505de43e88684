package services

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

func uniqueName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func tenantID(t *testing.T, db *models.DB, name string) int64 {
	t.Helper()
	var tn models.Tenant
	require.NoError(t, db.Where("name = ?", name).Take(&tn).Error)
	return tn.ID
}

func TestAPIKeyCreateAndAuthenticate(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		tenant := uniqueName("acme-")
		secret, err := b.accounts.CreateAPIKey(bg, Installation(), tenant, "billing service", "")
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(secret, "idg_"), secret)
		require.Len(t, secret, len("idg_")+43) // 256 random bits, base64url

		p, err := b.auth.Authenticate(bg, secret)
		require.NoError(t, err)
		tid := tenantID(t, b.db, tenant)
		require.Equal(t, tid, p.TenantID)
		require.Equal(t, secret[:12], p.Prefix)

		// Only a hash and a short prefix are stored.
		var k models.APIKey
		require.NoError(t, b.db.Where("id = ?", p.APIKeyID).Take(&k).Error)
		require.Equal(t, hashSecret(secret), k.SecretHash)
		require.Equal(t, "billing service", k.Label)
		require.NotContains(t, k.SecretHash+k.Prefix+k.Label, secret)

		// A second key of the same tenant joins it; a supplied secret is used as given.
		supplied := uniqueName("supplied_Key-0123456789_") // 24-128 of [A-Za-z0-9_-]
		got, err := b.accounts.CreateAPIKey(bg, Installation(), tenant, "", supplied)
		require.NoError(t, err)
		require.Equal(t, supplied, got)
		p2, err := b.auth.Authenticate(bg, supplied)
		require.NoError(t, err)
		require.Equal(t, tid, p2.TenantID)
		require.NotEqual(t, p.APIKeyID, p2.APIKeyID)

		for name, s := range map[string]string{
			"unknown":    secret + "x",
			"empty":      "",
			"other case": strings.ToUpper(secret),
			"too long":   strings.Repeat("a", 300),
		} {
			_, err := b.auth.Authenticate(bg, s)
			require.ErrorIs(t, err, ErrUnauthorized, name)
		}

		// Invalid input creates nothing.
		var before int64
		require.NoError(t, b.db.Model(&models.APIKey{}).Count(&before).Error)
		for name, c := range map[string][3]string{
			"short secret":    {tenant, "", "too-short"},
			"bad secret char": {tenant, "", "has a space 0123456789abcdef"},
			"long secret":     {tenant, "", strings.Repeat("k", 129)},
			"bad tenant":      {"no spaces allowed", "", ""},
			"empty tenant":    {"", "", ""},
		} {
			_, err := b.accounts.CreateAPIKey(bg, Installation(), c[0], c[1], c[2])
			require.ErrorIs(t, err, ErrInvalidRequest, name)
		}
		var after int64
		require.NoError(t, b.db.Model(&models.APIKey{}).Count(&after).Error)
		require.Equal(t, before, after)
	})
}

func TestValidateAPIKeySecret(t *testing.T) {
	t.Parallel()
	for s, ok := range map[string]bool{
		strings.Repeat("a", 23):          false,
		strings.Repeat("a", 24):          true,
		strings.Repeat("Z", 128):         true,
		strings.Repeat("Z", 129):         false,
		"abc_DEF-0123456789xyzXYZ":       true,
		"abc_DEF-0123456789xyzXY!":       false,
		"abc_DEF-0123456789xyzXY\n":      false,
		"ключключключключключключ":       false,
		"abc_DEF-0123456789xyzXYZ\x00ab": false,
	} {
		require.Equal(t, ok, ValidateAPIKeySecret(s) == "", "%q", s)
	}
}

// A revoked key stops working within CacheTTL, also on an instance that had it cached.
func TestAPIKeyRevoke(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		tenant := uniqueName("revoke-")
		secret, err := b.accounts.CreateAPIKey(bg, Installation(), tenant, "", "")
		require.NoError(t, err)
		keep, err := b.accounts.CreateAPIKey(bg, Installation(), tenant, "", "")
		require.NoError(t, err)
		_, err = b.auth.Authenticate(bg, secret) // now cached
		require.NoError(t, err)

		// Revoked by another instance, so this one's cache is not told.
		n, err := NewAccounts(b.db, nil, nil).RevokeAPIKey(bg, Installation(), APIKeyRef{Key: " " + secret[:12] + " "})
		require.NoError(t, err)
		require.EqualValues(t, 1, n)

		// Another instance (no cache) refuses it at once.
		_, err = NewAuth(b.db, nil).Authenticate(bg, secret)
		require.ErrorIs(t, err, ErrUnauthorized)

		// This instance refuses it once its cache entry is older than CacheTTL.
		var last error
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, last = b.auth.Authenticate(bg, secret); last != nil {
				break
			}
		}
		require.ErrorIs(t, last, ErrUnauthorized, "a revoked key kept working")
		_, err = b.auth.Authenticate(bg, secret)
		require.ErrorIs(t, err, ErrUnauthorized, "a revoked key works again")

		// The tenant's other key is untouched.
		p, err := b.auth.Authenticate(bg, keep)
		require.NoError(t, err)
		require.Equal(t, tenantID(t, b.db, tenant), p.TenantID)

		// Revoking again, or an unknown key, is not found.
		_, err = b.accounts.RevokeAPIKey(bg, Installation(), APIKeyRef{Key: secret[:12]})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.accounts.RevokeAPIKey(bg, Installation(), APIKeyRef{Key: "idg_nosuchkey"})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = b.accounts.RevokeAPIKey(bg, Installation(), APIKeyRef{Key: "  "})
		require.ErrorIs(t, err, ErrNotFound)

		// Revoking by the full secret works too.
		n, err = b.accounts.RevokeAPIKey(bg, Installation(), APIKeyRef{Key: keep})
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		_, err = NewAuth(b.db, nil).Authenticate(bg, keep)
		require.ErrorIs(t, err, ErrUnauthorized)
	})
}

func TestCreateOperatorAndLogin(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *testBundle) {
		tenant := uniqueName("ops-")
		_, err := b.accounts.CreateAPIKey(bg, Installation(), tenant, "", "") // creates the tenant
		require.NoError(t, err)
		global, restricted := uniqueName("alice-"), uniqueName("bob-")
		const pw = "correct horse battery"

		acc, err := b.accounts.CreateOperator(bg, Installation(), global, pw, RoleAdmin, "")
		require.NoError(t, err)
		require.Equal(t, global, acc.Username)
		require.Equal(t, RoleAdmin, acc.Role)
		require.Nil(t, acc.TenantID)
		acc2, err := b.accounts.CreateOperator(bg, Installation(), restricted, pw, RoleAuditor, tenant)
		require.NoError(t, err)
		require.Equal(t, tenantID(t, b.db, tenant), deref(acc2.TenantID))

		var stored models.Operator
		require.NoError(t, b.db.Where("id = ?", acc.ID).Take(&stored).Error)
		require.NotContains(t, stored.PasswordHash, pw)
		require.True(t, strings.HasPrefix(stored.PasswordHash, "$2"), "bcrypt hash")

		var refused []string // usernames that must not exist afterwards (a global count would race parallel tests)
		for _, tc := range []struct {
			name, username, password, role, tenant, field string
		}{
			{"short password", uniqueName("u-"), "elevenchars", RoleOperator, "", "password"},
			{"password over 72 bytes", uniqueName("u-"), strings.Repeat("p", 73), RoleOperator, "", "password"},
			{"short multibyte password", uniqueName("u-"), "ключключклю", RoleOperator, "", "password"},
			{"bad role", uniqueName("u-"), pw, "root", "", "role"},
			{"empty role", uniqueName("u-"), pw, "", "", "role"},
			{"unknown tenant", uniqueName("u-"), pw, RoleOperator, uniqueName("nope-"), "tenant"},
			{"taken username", global, pw, RoleOperator, "", "username"},
			{"bad username", "has space", pw, RoleOperator, "", "username"},
			{"empty username", "", pw, RoleOperator, "", "username"},
		} {
			if tc.username != global {
				refused = append(refused, tc.username)
			}
			_, err := b.accounts.CreateOperator(bg, Installation(), tc.username, tc.password, tc.role, tc.tenant)
			require.ErrorIs(t, err, ErrInvalidRequest, tc.name)
			var de *Error
			require.ErrorAs(t, err, &de)
			require.Len(t, de.Fields, 1, tc.name)
			require.Equal(t, tc.field, de.Fields[0].Field, tc.name)
		}
		var created int64
		require.NoError(t, b.db.Model(&models.Operator{}).Where("username IN ?", refused).Count(&created).Error)
		require.Zero(t, created)

		got, err := b.auth.Login(bg, restricted, pw)
		require.NoError(t, err)
		require.Equal(t, acc2, got)
		_, err = b.auth.Login(bg, restricted, pw+"x")
		require.ErrorIs(t, err, ErrUnauthorized)
		_, err = b.auth.Login(bg, strings.ToUpper(restricted), pw) // unknown user: usernames are exact
		require.ErrorIs(t, err, ErrUnauthorized)

		byID, err := b.auth.Operator(bg, acc.ID)
		require.NoError(t, err)
		require.Equal(t, acc, byID)
		_, err = b.auth.Operator(bg, acc.ID+1_000_000)
		require.ErrorIs(t, err, ErrNotFound)
	})
}

func TestBootstrap(t *testing.T) {
	t.Parallel()
	modeltest.Each(t, modeltest.Fresh(t), func(t *testing.T, db *models.DB) {
		count := func() (ops, keys int64) {
			require.NoError(t, db.Model(&models.Operator{}).Count(&ops).Error)
			require.NoError(t, db.Model(&models.APIKey{}).Count(&keys).Error)
			return
		}
		auth := NewAuth(db, nil)
		accounts := NewAccounts(db, nil, auth)
		res, err := accounts.Bootstrap(bg, "", "")
		require.NoError(t, err)
		require.True(t, res.AdminCreated)
		require.True(t, res.APIKeyCreated)
		require.Len(t, res.AdminPassword, 24)
		require.True(t, strings.HasPrefix(res.APIKey, "idg_"))

		acc, err := auth.Login(bg, "admin", res.AdminPassword)
		require.NoError(t, err)
		require.Equal(t, RoleAdmin, acc.Role)
		require.Nil(t, acc.TenantID)
		p, err := auth.Authenticate(bg, res.APIKey)
		require.NoError(t, err)
		require.Equal(t, tenantID(t, db, DefaultTenant), p.TenantID)

		// Once is enough: a second start creates and prints nothing.
		again, err := accounts.Bootstrap(bg, "", "")
		require.NoError(t, err)
		require.Equal(t, &BootstrapResult{}, again)
		ops, keys := count()
		require.EqualValues(t, 1, ops)
		require.EqualValues(t, 1, keys)

		// Supplied secrets are used and not echoed back.
		require.NoError(t, db.Exec("DELETE FROM operators").Error)
		require.NoError(t, db.Exec("DELETE FROM api_keys").Error)
		const pw, key = "supplied admin password", "supplied_bootstrap_key_0123"
		res, err = accounts.Bootstrap(bg, pw, key)
		require.NoError(t, err)
		require.Equal(t, &BootstrapResult{AdminCreated: true, APIKeyCreated: true}, res)
		_, err = auth.Login(bg, "admin", pw)
		require.NoError(t, err)
		p, err = NewAuth(db, nil).Authenticate(bg, key)
		require.NoError(t, err)
		require.Equal(t, tenantID(t, db, DefaultTenant), p.TenantID)

		// Weak or malformed supplied secrets are refused (bcrypt is slow under -race, so the
		// admin account is kept while the API key is tried).
		require.NoError(t, db.Exec("DELETE FROM api_keys").Error)
		_, err = accounts.Bootstrap(bg, "", "not a valid key")
		require.ErrorIs(t, err, ErrInvalidRequest)
		ops, keys = count()
		require.EqualValues(t, 1, ops)
		require.Zero(t, keys)
		require.NoError(t, db.Exec("DELETE FROM operators").Error)
		_, err = accounts.Bootstrap(bg, "short", "")
		require.ErrorIs(t, err, ErrInvalidRequest)
		ops, _ = count()
		require.Zero(t, ops)
	})
}
