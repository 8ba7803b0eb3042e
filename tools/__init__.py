"""stockade.tools"""
