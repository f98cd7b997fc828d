#!/usr/bin/env bash
# Capture what apt, dpkg, DKMS and kmod print for the lab's stand-in NVIDIA driver (tests/lab/dkms/build-standin-debs),
# on a lab VM, into /root/driver-capture/ there: the parsers' fixtures
# (tests/unit/plugins/module_utils/fixtures/driver/). Run inside a fresh lab VM as root:
#   tests/lab/lab ssh lab1 'bash -s' < tests/tools/capture_driver_standin.sh
# It installs the stand-in 1.0, tries 1.1 and 1.3 in private DKMS trees, and installs 1.3 for real once to record
# apt's failure, then puts 1.0 back.
set -u
out=/root/driver-capture
rm -rf "$out"; mkdir -p "$out"
export LC_ALL=C LANG=C
cap() { # NAME CMD...: stdout, stderr and rc of CMD into NAME.{out,err,rc}
    local name=$1; shift
    "$@" > "$out/$name.out" 2> "$out/$name.err"; echo $? > "$out/$name.rc"
}
P="gpufleet-nvidia-standin-utils gpufleet-nvidia-standin-dkms"
cap sim-1.0 apt-get install -s --no-install-recommends --allow-change-held-packages \
    gpufleet-nvidia-standin-utils=1.0 gpufleet-nvidia-standin-dkms=1.0
cap install-1.0 apt-get install -y --no-install-recommends gpufleet-nvidia-standin-utils=1.0 gpufleet-nvidia-standin-dkms=1.0
cap modprobe-1.0 modprobe gpufleet_nvidia
cap proc-version-1.0 cat /proc/driver/gpufleet_nvidia/version
cap modinfo-1.0 modinfo gpufleet_nvidia
cap dkms-status-1.0 dkms status
# shellcheck disable=SC2016 # dpkg-query's own ${field} format, not the shell's
cap dpkg-query dpkg-query -W -f '${Package}\t${Version}\t${db:Status-Abbrev}\n'
cap sim-1.1 apt-get install -s --no-install-recommends --allow-change-held-packages \
    gpufleet-nvidia-standin-utils=1.1 gpufleet-nvidia-standin-dkms=1.1
cap sim-9.9 apt-get install -s --no-install-recommends --allow-change-held-packages gpufleet-nvidia-standin-utils=9.9
for v in 1.1 1.3; do
    w=/var/tmp/capture-$v
    rm -rf "$w"; mkdir -p "$w/archives" "$w/dkms"
    cap download-$v env -C "$w/archives" apt-get download gpufleet-nvidia-standin-dkms=$v
    dpkg-deb -x "$w/archives/gpufleet-nvidia-standin-dkms_${v}_all.deb" "$w/root"
    cap trial-add-$v dkms add -m gpufleet-nvidia -v $v --dkmstree "$w/dkms" --sourcetree "$w/root/usr/src"
    cap trial-build-$v dkms build -m gpufleet-nvidia -v $v -k "$(uname -r)" --force --dkmstree "$w/dkms" \
        --sourcetree "$w/root/usr/src"
    cp "$w/dkms/gpufleet-nvidia/$v/build/make.log" "$out/trial-make-$v.log" 2>/dev/null
    find "$w/dkms" -name '*.ko*' > "$out/trial-files-$v.txt"
    ko=$(find "$w/dkms/gpufleet-nvidia/$v" -name 'gpufleet_nvidia.ko*' | head -1)
    [ -n "$ko" ] && cap trial-modinfo-$v modinfo "$ko"
done
cap dkms-status-after-trials dkms status
cap install-1.3 apt-get install -y --no-install-recommends --allow-change-held-packages \
    gpufleet-nvidia-standin-utils=1.3 gpufleet-nvidia-standin-dkms=1.3
cap dkms-status-1.3 dkms status
cp /var/lib/dkms/gpufleet-nvidia/1.3/build/make.log "$out/install-make-1.3.log" 2>/dev/null
cap back-1.0 apt-get install -y --no-install-recommends --allow-downgrades --allow-change-held-packages \
    gpufleet-nvidia-standin-utils=1.0 gpufleet-nvidia-standin-dkms=1.0
cap dkms-status-back dkms status
# shellcheck disable=SC2086 # a list of package names
cap hold apt-mark hold $P
cap showhold apt-mark showhold
# shellcheck disable=SC2217 # the open file is the point: it holds the module, as a CUDA process holds nvidia.ko
sleep 3600 < /dev/gpufleet_nvidia0 &
holder=$!
sleep 1
ls -l /proc/$holder/fd > "$out/holder-fd.txt" 2>&1
cat /proc/$holder/cgroup > "$out/holder-cgroup.txt"
cap rmmod-held modprobe -r gpufleet_nvidia
kill $holder
cap uname uname -r
ls /lib/modules > "$out/lib-modules.txt"; ls /boot > "$out/boot.txt"; df -k /boot > "$out/df-boot.txt"
echo "capture complete"
