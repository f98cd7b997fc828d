// SPDX-License-Identifier: GPL-2.0
// gpufleet VM lab: a stand-in for the NVIDIA kernel module, built by DKMS from the
// gpufleet-nvidia-standin-dkms package. Like nvidia.ko it says its version in
// /proc/driver/<name>/version in NVRM's words and in modinfo's "version:" field, and it has a
// device node (/dev/gpufleet_nvidia0, as /dev/nvidia0) whose open file holds the module, so the
// collection's driver checks read and reload it exactly as they do the real driver.
#include <linux/fs.h>
#include <linux/init.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include "version.h"

#ifdef STANDIN_NEEDS_NEWER_KERNEL
// This release calls a kernel interface the running kernel does not have (as a driver release
// written for a newer kernel does): it does not compile here.
static void standin_probe_newer_kernel(void)
{
	gpufleet_kernel_api_from_a_newer_release();
}
#endif

static struct proc_dir_entry *standin_dir;

static int standin_open(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations standin_fops = {
	.owner = THIS_MODULE,	/* an open file holds the module, as a CUDA process holds nvidia.ko */
	.open = standin_open,
};

static struct miscdevice standin_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "gpufleet_nvidia0",
	.fops = &standin_fops,
	.mode = 0666,
};

static int standin_version_show(struct seq_file *m, void *v)
{
	seq_printf(m, "NVRM version: gpufleet stand-in Kernel Module  %s  Release Build  (gpufleet lab)\n",
		   STANDIN_VERSION);
	seq_printf(m, "GCC version:  gcc (lab)\n");
	return 0;
}

static int __init gpufleet_nvidia_init(void)
{
	standin_dir = proc_mkdir("driver/gpufleet_nvidia", NULL);
	if (!standin_dir)
		return -ENOMEM;
	if (!proc_create_single("version", 0444, standin_dir, standin_version_show)) {
		proc_remove(standin_dir);
		return -ENOMEM;
	}
	if (misc_register(&standin_dev)) {
		proc_remove(standin_dir);
		return -EBUSY;
	}
	pr_info("NVRM: loading gpufleet stand-in Kernel Module  %s\n", STANDIN_VERSION);
	return 0;
}

static void __exit gpufleet_nvidia_exit(void)
{
	misc_deregister(&standin_dev);
	proc_remove(standin_dir);
	pr_info("NVRM: gpufleet stand-in Kernel Module %s unloaded\n", STANDIN_VERSION);
}

module_init(gpufleet_nvidia_init);
module_exit(gpufleet_nvidia_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(STANDIN_VERSION);
MODULE_DESCRIPTION("gpufleet VM lab: a stand-in for the NVIDIA kernel module");
