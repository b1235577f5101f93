package kubeclient

import (
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ConfigMap is the part of a core/v1 ConfigMap the agent reads (a trust
// bundle's key), decoded from the API server's JSON like Pod.
type ConfigMap struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Data              map[string]string `json:"data,omitempty"`
	BinaryData        map[string][]byte `json:"binaryData,omitempty"`
}

// ConfigMapList is a page of ConfigMaps.
type ConfigMapList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ConfigMap `json:"items"`
}

// DeepCopyInto copies c into out.
func (c *ConfigMap) DeepCopyInto(out *ConfigMap) {
	*out = *c
	c.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Data = maps.Clone(c.Data)
	if c.BinaryData != nil {
		out.BinaryData = make(map[string][]byte, len(c.BinaryData))
		for k, v := range c.BinaryData {
			out.BinaryData[k] = append([]byte(nil), v...)
		}
	}
}

// DeepCopyObject implements runtime.Object.
func (c *ConfigMap) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	out := new(ConfigMap)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *ConfigMapList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &ConfigMapList{TypeMeta: l.TypeMeta, Items: deepCopyItems(l.Items)}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	return out
}
