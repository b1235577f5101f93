package podcgroup_test

import (
	"fmt"

	"github.com/meshagent/meshagent/internal/node/podcgroup"
)

func ExampleParse() {
	data := []byte("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_5b6a_4789_8abc_def012345678.slice/cri-containerd-0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd.scope\n")
	p, err := podcgroup.Parse(data)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.UID, p.ContainerID)
	// Output: 1f2e3d4c-5b6a-4789-8abc-def012345678 0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd0123abcd
}
