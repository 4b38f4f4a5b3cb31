module gpuhost/provider/stub

go 1.22
