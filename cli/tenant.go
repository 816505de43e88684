package cli

import (
	"strconv"

	"github.com/idemgate/idemgate/services"
	"github.com/spf13/cobra"
)

// tenantCmd is tenant list. Tenants are created by apikey create (docs/reference.md §7).
func tenantCmd(env Env) *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "List tenants (apikey create makes them)"}
	list := &cobra.Command{
		Use:   "list",
		Short: "List tenants: name, API keys (active / all), created",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return withAccounts(c.Context(), env, func(accounts *services.Accounts) error {
				tenants, err := accounts.ListTenants(c.Context(), commandLine)
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(tenants))
				for _, t := range tenants {
					rows = append(rows, []string{t.Name, strconv.FormatInt(t.ActiveKeys, 10), strconv.FormatInt(t.APIKeys, 10), when(&t.CreatedAt)})
				}
				return table(env.Stdout, "NAME\tACTIVE KEYS\tALL KEYS\tCREATED", rows)
			})
		},
	}
	cmd.AddCommand(list)
	return cmd
}
