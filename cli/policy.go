package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idemgate/idemgate/services"
	"github.com/spf13/cobra"
)

// policyCmd is `idemgate policy set|list|delete` (docs/reference.md §2 "Policies"): the
// defaults a tenant's acquires take, for every operation or for one operation name. A change
// applies to running instances' acquires within services.PolicyMaxAge.
func policyCmd(env Env) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Manage lifecycle policies: a tenant's ttl, lease, on_expiry, retention and horizon"}
	withPolicies := func(c *cobra.Command, fn func(*services.Policies) error) error {
		_, log, db, err := open(c.Context(), env)
		if err != nil {
			return err
		}
		defer db.Close()
		return fn(services.NewPolicies(db, log))
	}

	var tenant, operation, ttl, lease, onExpiry, retention, horizon string
	set := &cobra.Command{
		Use: "set --tenant T [--operation O] [--ttl D] [--lease D] [--on-expiry readmit|hold_until_reconciled] " +
			"[--retention D] [--horizon D]",
		Short: "Set the policy of a tenant (or of one of its operation names), replacing the one there was",
		Long: "Set the policy of a tenant, or with --operation of one operation name of it, replacing the one " +
			"there was: a field not given is not set by this policy afterwards (the tenant-wide policy, then the " +
			"built-in default, decides it). Durations: 90d, 1h, 30s, 1s, or bare seconds.",
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			in := services.PolicyInput{Tenant: tenant, Operation: operation}
			var err error
			if in.TTL, err = optionalDuration(c, "ttl", ttl); err != nil {
				return err
			}
			if in.Lease, err = optionalDuration(c, "lease", lease); err != nil {
				return err
			}
			if c.Flags().Changed("on-expiry") {
				in.OnExpiry = &onExpiry
			}
			if in.Retention, err = optionalDuration(c, "retention", retention); err != nil {
				return err
			}
			if in.Horizon, err = optionalDuration(c, "horizon", horizon); err != nil {
				return err
			}
			return withPolicies(c, func(ps *services.Policies) error {
				p, err := ps.Set(c.Context(), services.Installation(), in)
				if err != nil {
					return describe(err)
				}
				fmt.Fprintf(env.Stderr, "policy set for tenant %q, %s: %s\n(running instances apply it to new admissions within %s; "+
					"admitted operations keep theirs)\n", p.Tenant, scope(p.Operation), fields(*p), services.FormatDuration(services.PolicyMaxAge))
				return nil
			})
		},
	}
	set.Flags().StringVar(&tenant, "tenant", "", "an existing tenant's name (required)")
	set.Flags().StringVar(&operation, "operation", "", "only acquires with this operation name (default: every operation)")
	set.Flags().StringVar(&ttl, "ttl", "", "TTL of acquires that leave out ttl_seconds")
	set.Flags().StringVar(&lease, "lease", "", "lease of acquires that leave out lease_seconds (cut to their TTL)")
	set.Flags().StringVar(&onExpiry, "on-expiry", "", "on_expiry of acquires that leave it out: readmit or hold_until_reconciled")
	set.Flags().StringVar(&retention, "retention", "", "how long an ended operation's evidence is kept (default IDEMGATE_RETENTION)")
	set.Flags().StringVar(&horizon, "horizon", "", "how long after a success the key refuses a new admission (at least the retention; default none)")
	_ = set.MarkFlagRequired("tenant")

	var listTenant string
	list := &cobra.Command{
		Use:   "list [--tenant T]",
		Short: "List policies: tenant, operation, ttl, lease, on_expiry, retention, horizon, updated by, updated",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return withPolicies(c, func(ps *services.Policies) error {
				policies, err := ps.List(c.Context(), listTenant)
				if err != nil {
					return describe(err)
				}
				rows := make([][]string, 0, len(policies))
				for _, p := range policies {
					op := p.Operation
					if op == "" {
						op = "*"
					}
					onExpiry := "-"
					if p.OnExpiry != nil {
						onExpiry = *p.OnExpiry
					}
					rows = append(rows, []string{p.Tenant, op, secondsOrDash(p.TTL), secondsOrDash(p.Lease), onExpiry,
						secondsOrDash(p.Retention), secondsOrDash(p.Horizon), p.UpdatedBy, when(&p.UpdatedAt)})
				}
				return table(env.Stdout, "TENANT\tOPERATION\tTTL\tLEASE\tON EXPIRY\tRETENTION\tHORIZON\tUPDATED BY\tUPDATED", rows)
			})
		},
	}
	list.Flags().StringVar(&listTenant, "tenant", "", "only this tenant's policies")

	var delTenant, delOperation string
	del := &cobra.Command{
		Use:   "delete --tenant T [--operation O]",
		Short: "Delete the policy of a tenant (or of one of its operation names)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return withPolicies(c, func(ps *services.Policies) error {
				if err := ps.Delete(c.Context(), services.Installation(), delTenant, delOperation); err != nil {
					return describe(err)
				}
				fmt.Fprintf(env.Stderr, "policy deleted for tenant %q, %s\n", delTenant, scope(delOperation))
				return nil
			})
		},
	}
	del.Flags().StringVar(&delTenant, "tenant", "", "the tenant's name (required)")
	del.Flags().StringVar(&delOperation, "operation", "", "the operation name's policy (default: the tenant-wide one)")
	_ = del.MarkFlagRequired("tenant")

	cmd.AddCommand(set, list, del)
	return cmd
}

// optionalDuration parses flag name's value s when the flag was given, nil when not.
func optionalDuration(c *cobra.Command, name, s string) (*time.Duration, error) {
	if !c.Flags().Changed(name) {
		return nil, nil
	}
	d, err := services.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("--%s: %q is not a duration such as 90d, 1h, 30s or 3600 (seconds), at most 100 years", name, s)
	}
	return &d, nil
}

func scope(operation string) string {
	if operation == "" {
		return "every operation"
	}
	return "operation " + strconv.Quote(operation)
}

func fields(p services.PolicyInfo) string {
	s := "ttl " + secondsOrDash(p.TTL) + ", lease " + secondsOrDash(p.Lease) + ", on_expiry "
	if p.OnExpiry != nil {
		s += *p.OnExpiry
	} else {
		s += "-"
	}
	return s + ", retention " + secondsOrDash(p.Retention) + ", horizon " + secondsOrDash(p.Horizon)
}

// secondsOrDash is d as it is typed ("90d", "1h30m"), "-" when not set.
func secondsOrDash(d *time.Duration) string {
	if d == nil {
		return "-"
	}
	return services.FormatDuration(*d)
}
