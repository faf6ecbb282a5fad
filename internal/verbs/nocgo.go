//go:build !cgo

package verbs

// This module calls librdmacm and libibverbs through cgo. Without cgo the
// build stops here, on an identifier that says what to do.
var _ = this_module_needs_cgo_and_rdma_core__build_with_CGO_ENABLED_1_and_install_libibverbs_dev_and_librdmacm_dev
