package podcgroup

import "testing"

func BenchmarkParse(b *testing.B) {
	data := []byte("12:hugetlb:/\n11:memory:/\n8:pids:/kubepods/besteffort/pod" + uid + "/" + cid + "\n" +
		"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + uidU + ".slice/cri-containerd-" + cid + ".scope\n")
	// The two shapes name the same pod and container.
	if _, err := Parse(data); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
