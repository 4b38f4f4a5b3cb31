"""NVIDIA's installers as the stack declares them (gpuhost:runtime.nvidia / .cuda): shared by the config, which
warns at preview, and the serving side, which refuses to install (standard library only)."""

# The example stack's (Pulumi.prod.yaml) sha256 of an installer it cannot know: 64 zeros. A stack with it previews
# (with a warning) and its `up` installs nothing until the operator sets the real one (where_sums says where).
PLACEHOLDER_SHA256 = '0' * 64


def where_sums(key: str, name: str) -> str:
    if key.endswith('nvidia'):
        return ('NVIDIA publishes the driver\'s checksum with the download (download.nvidia.com, the version\'s '
                'directory: %s.sha256sum), or take sha256sum of a copy you verified' % name)
    return ('NVIDIA publishes the CUDA runfiles\' md5 sums per release (developer.download.nvidia.com/compute/cuda/'
            '<version>/docs/sidebar/md5sum.txt): check %s against it, then take its sha256sum' % name)
