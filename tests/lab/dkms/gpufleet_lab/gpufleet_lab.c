// SPDX-License-Identifier: GPL-2.0
// gpufleet VM lab: a real kernel module, built by DKMS, standing in for the GPU driver.
#include <linux/init.h>
#include <linux/module.h>
#include <linux/utsname.h>

static int __init gpufleet_lab_init(void)
{
	pr_info("gpufleet_lab: loaded on %s\n", utsname()->release);
	return 0;
}

static void __exit gpufleet_lab_exit(void)
{
	pr_info("gpufleet_lab: unloaded\n");
}

module_init(gpufleet_lab_init);
module_exit(gpufleet_lab_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gpufleet VM lab: a DKMS module standing in for the GPU driver");
