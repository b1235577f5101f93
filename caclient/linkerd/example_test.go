package linkerd_test

import (
	"fmt"

	"github.com/meshagent/meshagent/caclient/linkerd"
)

func ExampleDefaultServerName() {
	fmt.Println(linkerd.DefaultServerName("linkerd", "cluster.local"))
	// Output: linkerd-identity.linkerd.serviceaccount.identity.linkerd.cluster.local
}
