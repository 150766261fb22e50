"""FAKE of DCGM's ``DcgmHandle`` class, for tests: DCGM cannot exist here."""

import dcgm_agent
import dcgm_structs
import pydcgm


class DcgmHandle:
    def __init__(self, handle=None, ipAddress=None, opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO,
                 persistAfterDisconnect=False, unixSocketPath=None, timeoutMs=0):
        self._handleCreated = False
        if handle is not None:
            self.handle = handle
            return
        if ipAddress is not None and unixSocketPath is not None:
            raise dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_BADPARAM)
        dcgm_structs._dcgmInit()
        dcgm_agent.dcgmInit()
        if ipAddress is None and unixSocketPath is None:
            self.handle = dcgm_agent.dcgmStartEmbedded(opMode)
            self.isEmbedded = True
        else:
            params = {"timeoutMs": timeoutMs, "persistAfterDisconnect": int(bool(persistAfterDisconnect)),
                      "addressIsUnixSocket": int(ipAddress is None)}
            self.handle = dcgm_agent.dcgmConnect_v2(ipAddress if ipAddress is not None else unixSocketPath,
                                                    params)
            self.isEmbedded = False
        self._handleCreated = True

    def GetSystem(self):
        return pydcgm.DcgmSystem(self)

    def Shutdown(self):
        if not self._handleCreated:
            return
        if self.isEmbedded:
            dcgm_agent.dcgmStopEmbedded(self.handle)
        else:
            dcgm_agent.dcgmDisconnect(self.handle)
        self._handleCreated = False
        self.handle = None
