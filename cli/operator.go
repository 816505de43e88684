package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemgate/idemgate/services"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// commandLine is the account the administration commands act as. Whoever runs them holds the
// database's credentials and could change any row anyway, so the command line is a global
// admin; "command line" is the "by" of what services log. `apikey create`, `apikey revoke` and
// `operator create` act as the installation instead (services.Accounts, by nil), as Bootstrap
// does: they print what they did themselves.
var commandLine = &services.OperatorAccount{Username: "command line", Role: services.RoleAdmin}

// withAccounts opens the database (migrating it, like every command) and runs fn with an
// Accounts on it.
func withAccounts(ctx context.Context, env Env, fn func(*services.Accounts) error) error {
	_, log, db, err := open(ctx, env)
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(services.NewAccounts(db, log, nil))
}

// table writes rows under header, aligned in columns.
func table(w io.Writer, header string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// when formats a moment for the listings: UTC, to the second; "-" for never.
func when(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// orDash is s, or "-" when s is empty, so that a listing's columns never collapse.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// operatorAdminCmds are operator list, delete and passwd.
func operatorAdminCmds(env Env) []*cobra.Command {
	list := &cobra.Command{
		Use:   "list",
		Short: "List dashboard accounts: username, role, tenant, created (never password hashes)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return withAccounts(c.Context(), env, func(accounts *services.Accounts) error {
				ops, err := accounts.ListOperators(c.Context(), commandLine)
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(ops))
				for _, o := range ops {
					tenant := o.Tenant
					if tenant == "" {
						tenant = "(global)"
					}
					rows = append(rows, []string{o.Username, o.Role, tenant, when(&o.CreatedAt)})
				}
				return table(env.Stdout, "USERNAME\tROLE\tTENANT\tCREATED", rows)
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete USERNAME",
		Short: "Delete a dashboard account (never the last global admin); its sessions end at their next request",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return withAccounts(c.Context(), env, func(accounts *services.Accounts) error {
				op, err := accounts.OperatorByUsername(c.Context(), commandLine, args[0])
				if errors.Is(err, services.ErrNotFound) {
					return fmt.Errorf("no dashboard account is called %q (see idemgate operator list)", args[0])
				} else if err != nil {
					return err
				}
				err = accounts.DeleteOperator(c.Context(), commandLine, op.ID)
				switch {
				case errors.Is(err, services.ErrLastAdmin):
					return fmt.Errorf("refusing to delete %q: it is the last global admin account, and without one nobody can administer "+
						"idemgate from the dashboard; create another first (idemgate operator create --role admin --username …)", op.Username)
				case errors.Is(err, services.ErrNotFound):
					return fmt.Errorf("no dashboard account is called %q (deleted meanwhile)", args[0])
				case err != nil:
					return err
				}
				fmt.Fprintf(env.Stdout, "deleted %s %q\n", op.Role, op.Username)
				return nil
			})
		},
	}
	var fromStdin bool
	passwd := &cobra.Command{
		Use:   "passwd USERNAME [--password-stdin]",
		Short: "Set a dashboard account's password: prompted twice on a terminal, else the first line of stdin (or IDEMGATE_PASSWORD)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			password, err := newPassword(env, fromStdin)
			if err != nil {
				return err
			}
			if msg := services.ValidatePassword(password); msg != "" {
				return fmt.Errorf("password: %s", msg)
			}
			return withAccounts(c.Context(), env, func(accounts *services.Accounts) error {
				op, err := accounts.OperatorByUsername(c.Context(), commandLine, args[0])
				if errors.Is(err, services.ErrNotFound) {
					return fmt.Errorf("no dashboard account is called %q (see idemgate operator list)", args[0])
				} else if err != nil {
					return err
				}
				if err := accounts.SetOperatorPassword(c.Context(), commandLine, op.ID, password); err != nil {
					return describe(err)
				}
				fmt.Fprintf(env.Stdout, "changed the password of %q\n", op.Username)
				return nil
			})
		},
	}
	passwd.Flags().BoolVar(&fromStdin, "password-stdin", false, "read the password from the first line of stdin, even on a terminal")
	return []*cobra.Command{list, del, passwd}
}

// newPassword gets the new password of operator passwd: the first line of stdin with
// --password-stdin; else IDEMGATE_PASSWORD when set (as operator create takes it); else a
// prompt, twice and without echo, when stdin is a terminal; else the first line of stdin.
func newPassword(env Env, fromStdin bool) (string, error) {
	if !fromStdin {
		if pw := env.Getenv("IDEMGATE_PASSWORD"); pw != "" {
			return pw, nil
		}
		if f, ok := env.Stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			return promptTwice(func() (string, error) {
				b, err := term.ReadPassword(int(f.Fd()))
				return string(b), err
			}, env.Stderr)
		}
	}
	line, err := bufio.NewReader(env.Stdin).ReadString('\n')
	if err != nil && line == "" {
		return "", errors.New("no password: write it on stdin (or set IDEMGATE_PASSWORD)")
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// promptTwice asks for a new password on w and reads it with read, twice; the two must agree
// (a typo in an unechoed password would lock the account's owner out).
func promptTwice(read func() (string, error), w io.Writer) (string, error) {
	fmt.Fprint(w, "New password: ")
	first, err := read()
	fmt.Fprintln(w)
	if err != nil {
		return "", err
	}
	fmt.Fprint(w, "Repeat it: ")
	second, err := read()
	fmt.Fprintln(w)
	if err != nil {
		return "", err
	}
	if first != second {
		return "", services.ErrPasswordMismatch
	}
	return first, nil
}

// apikeyListCmd is apikey list [--tenant T].
func apikeyListCmd(env Env) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   "list [--tenant T]",
		Short: "List API keys, newest first: prefix, tenant, label, created, last used, revoked (never secrets or hashes)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return withAccounts(c.Context(), env, func(accounts *services.Accounts) error {
				if tenant != "" {
					if err := tenantExists(c.Context(), accounts, tenant); err != nil {
						return err
					}
				}
				keys, err := accounts.ListAPIKeys(c.Context(), commandLine)
				if err != nil {
					return err
				}
				var rows [][]string
				for _, k := range keys {
					if tenant != "" && k.Tenant != tenant {
						continue
					}
					rows = append(rows, []string{k.Prefix, k.Tenant, orDash(k.Label), when(&k.CreatedAt), when(k.LastUsedAt), when(k.RevokedAt)})
				}
				return table(env.Stdout, "PREFIX\tTENANT\tLABEL\tCREATED\tLAST USED\tREVOKED", rows)
			})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant's keys")
	return cmd
}

// tenantExists refuses a --tenant that names no tenant, rather than listing nothing.
func tenantExists(ctx context.Context, accounts *services.Accounts, name string) error {
	tenants, err := accounts.ListTenants(ctx, commandLine)
	if err != nil {
		return err
	}
	for _, t := range tenants {
		if t.Name == name {
			return nil
		}
	}
	return fmt.Errorf("no tenant is called %q (see idemgate tenant list)", name)
}
