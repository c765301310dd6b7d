# shellcheck shell=bash
# hk_has_hw_kvm: true (status 0) when this machine's /dev/kvm is usable,
# hardware-assisted KVM (Intel VT-x or AMD-V), so real guests can run on it
# directly; false on PVM hosts like the project's machines (docs: rig.md),
# where guests must run inside the test rig (scripts/rig). Inside the rig's
# L1 it is true (nested KVM on emulated SVM). Sourced, not run; no output.
hk_has_hw_kvm() {
	[[ -c /dev/kvm && -r /dev/kvm && -w /dev/kvm ]] || return 1
	# PVM (Pagetable-based Virtual Machine) runs only PVM-enabled guest kernels.
	[[ ! -e /sys/module/kvm_pvm ]] || return 1
	grep -qwE 'vmx|svm' /proc/cpuinfo
}
