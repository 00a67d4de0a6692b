# Sourced by the packaging tests that run a Debian root made by packaging/make-sysroot.sh
# (old_userland_test.sh, aarch64_test.sh): the root is only read, and everything runs in
# `unshare --mount --pid`, chrooted into an overlayfs over it whose writable layer is a tmpfs of
# that mount namespace, so every mount, file and process goes with the namespace.
# The caller defines fail MESSAGE... (prints and exits).

# The host can do it: root, the tools, overlayfs.
root_overlay_preflight() {
  local tool
  [ "$(id -u)" = 0 ] || fail "needs root (mount and pid namespaces, overlayfs, chroot); run it as root"
  for tool in unshare chroot mount timeout; do
    command -v "$tool" > /dev/null || fail "$tool is missing (util-linux, coreutils)"
  done
  grep -qw overlay /proc/filesystems || modprobe overlay 2> /dev/null || true
  grep -qw overlay /proc/filesystems ||
    fail "the kernel has no overlayfs (modprobe overlay, or a kernel with CONFIG_OVERLAY_FS)"
}

# root_overlay_mount ROOT LAYER MERGED: inside the mount namespace, a tmpfs (4 GiB at most) at
# LAYER holding the overlay's upper and work folders, ROOT under the overlay at MERGED, and there
# a fresh /proc, the host's /dev and a read-only /sys.
root_overlay_mount() {
  local root=$1 layer=$2 merged=$3
  mkdir -p "$layer" "$merged"
  mount -t tmpfs -o mode=0755,size=4g root-overlay "$layer"
  mkdir "$layer/upper" "$layer/work"
  mount -t overlay overlay -o "lowerdir=$root,upperdir=$layer/upper,workdir=$layer/work" \
    "$merged" || fail "cannot mount overlayfs over $root"
  mount --rbind /dev "$merged/dev"
  mount -t proc proc "$merged/proc"
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$merged/sys"
}
